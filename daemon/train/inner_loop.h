// The one inner loop of every mode (DESIGN.md §2-3), run by every rank of a local ring:
//
//   rank 0: hook.BeforeStep → StepControl (stop? parameters it changed?) ─┐ broadcast to the ring
//   every rank: copy the changed parameters from rank 0                  ◀┘
//   every rank: sample its rows of the step's batch → forward_backward →
//               LocalComm::all_reduce (mean) → apply_update (clip + AdamW), LR from the schedule
//   every rank with a hook: hook.AfterStep (metrics, eval, checkpoint, the learner's outer sync)
//
// Rank 0 drives: it alone decides when the loop ends (end_step, a signal, a time limit, a crash)
// and alone talks to the world (sockets, files); the other ranks follow its StepControl, so every
// rank runs the same collectives in the same order. Because every rank applies the same mean
// gradient, the ranks keep bitwise the same parameters; parameters rank 0 changes outside the
// step (a fold of a Global, a snapshot) are broadcast before the next step.
// Modes plug in as hooks: none (a single learner: metrics, eval, checkpoints), ddp (M learners are
// one ring of M × R ranks), and the DiLoCo learner's outer sync (learner.h).
#pragma once

#include <cstddef>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/train/data.h"
#include "daemon/train/ring_control.h"
#include "daemon/util/status.h"
#include "kernels/backend.h"

namespace diloco {

// What rank 0 tells the ring before a step.
struct StepControl {
  bool stop = false;                // end the loop before this step
  std::vector<ParamRange> changed;  // the ranges rank 0 rewrote (folded or installed fragments)
  long lr_step = -1;                // >= 0: the LR schedule's position for this step (sync.lr_clock)
};

struct StepResult {
  long step = 0;  // the step just taken, from 0; step + 1 steps are done
  StepStats stats;  // loss: the mean over the ring's batch; applied: false when not finite
  float lr = 0;
  double step_s = 0;  // wall time of the step on this rank, collectives included
};

class InnerLoopHook {
 public:
  virtual ~InnerLoopHook() = default;
  // Rank 0 only, before step `step` (from 0) — and before stop/end checks of the loop itself.
  // Parameters changed through the backend must be listed in control. An error stops the ring.
  virtual Status BeforeStep(long step, TrainingBackend& backend, StepControl* control) = 0;
  // After every step, on every rank that has a hook. result.stats.applied false (a NaN/Inf loss
  // or gradient; nothing changed): return the error to report; OK gives a generic one.
  virtual Status AfterStep(const StepResult& result, TrainingBackend& backend) = 0;
};

struct InnerLoopOptions {
  long start_step = 0;
  long end_step = 0;  // rank 0 stops the ring here
  const TrainConfig* train = nullptr;  // LR schedule, AdamW, grad_clip
  // This rank's rows of each step's batch: sampler->SampleRows(step, row_begin, rows, ...).
  const BatchSampler* sampler = nullptr;
  int row_begin = 0;
  int rows = 1;
  int block_size = 1;  // T
  // A follower's side of rank 0's outer-sync commands between steps (ring_control.h); null: rank 0
  // sends none (its outer-sync state is its own).
  RingCommandHandler* commands = nullptr;
};

// The loop of rank `rank` of a ring training config from start_step to train.steps: each rank
// takes train.batch_size rows of the sampler's batch (which holds ranks × batch_size rows). config
// and sampler must outlive the loop.
InnerLoopOptions RankLoopOptions(const RunConfig& config, const BatchSampler& sampler, int rank, long start_step);

// Runs the loop on one rank until rank 0 stops it (end_step reached, or a StepControl with stop).
// hook may be null on ranks other than 0. *steps_done: the step the loop ended at (start_step +
// the steps taken). A collective that fails returns its error on every rank.
Status RunInnerLoop(const InnerLoopOptions& options, TrainingBackend& backend, LocalComm& comm,
                    InnerLoopHook* hook, long* steps_done);

// Rank 0 of a ring whose loop never ran (it failed or stopped before training): tells the other
// ranks, waiting for its first StepControl, to stop.
CommStatus StopFollowers(LocalComm& comm);

}  // namespace diloco
