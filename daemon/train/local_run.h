// Local mode with several learners (sync.learners > 1): M learner threads and one syncer thread
// in one process, over the real ZeroMQ transport (inproc endpoints; each learner's sockets go
// through an emulated WAN link when any sync.link.* key is set). RunTraining dispatches here.
// The run directory gets config.yaml, metrics.jsonl (the run's lines), learner-<i>.jsonl (each
// learner's, as a daemon's learner roles write them: run_dir.h), events.log (the syncer's merge
// tape) and global_state.bin; the final validation loss is that of the syncer's global model.
// Resume (TrainOptions::resume): the syncer restores run_dir/global_state.bin (versions, Θ, u and
// the ledger go on), and each learner joins from a snapshot at the step its learner-<i>.step file
// holds (run_dir.h; the same files the daemon's learner roles keep), with fresh AdamW moments
// (only the syncer's state is saved).
// Modes: decoupled, diloco and streaming here; ddp runs in ddp_run.h (threads averaging gradients,
// no syncer).
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/train/data.h"
#include "daemon/train/trainer.h"
#include "daemon/util/status.h"
#include "kernels/gpt.h"

namespace diloco {

struct LocalRunHooks {
  // Stop learner `crash_learner` (as if its site failed) once it has done `crash_after_steps`
  // steps; -1: nobody. For tests.
  int crash_learner = -1;
  long crash_after_steps = 0;
  // Hold every other learner before this step until the crashed learner has stopped, so the
  // others are still training after the crash (-1: no hold).
  long hold_others_at_step = -1;
  // Start the crashed learner again (same index, a new incarnation, join_from_snapshot,
  // start_step = the step it reached) once the syncer has merged this many more rounds since it
  // stopped, or every other learner is done, whichever comes first (0: no restart).
  uint64_t restart_after_merges = 0;
  // The syncer publishes the Global of (fragment, version) with a wrong CRC32C (every learner
  // then resyncs from a snapshot). version 0: never.
  uint32_t corrupt_crc_fragment = 0;
  uint64_t corrupt_crc_version = 0;
  // The syncer rejects the first delta of (learner, fragment) as if it failed its checks (the
  // learner must hear of it and send again). learner -1: never.
  int reject_first_delta_learner = -1;
  uint32_t reject_first_delta_fragment = 0;
  // The syncer publishes the Global of (fragment, version) with a NaN in its update (its own Θ
  // gets the real one): every learner must refuse it and resync. Needs sync.codec.down fp32.
  uint32_t nan_global_fragment = 0;
  uint64_t nan_global_version = 0;
  // Called on each learner's thread before every step (may block: a long step). May be empty.
  std::function<void(int learner, long step)> before_step;
};

// Per learner, for tests (RunLocal's last argument, may be null).
struct LocalRunDetails {
  std::vector<uint64_t> snapshots_installed;  // summed over incarnations
  std::vector<uint64_t> crc_mismatches;
  std::vector<uint64_t> gaps;
  std::vector<uint64_t> deltas_dropped;  // own deltas the syncer said it dropped or rejected
  std::vector<uint64_t> deltas_lost;     // own deltas found lost through the syncer's acks
  std::vector<uint64_t> globals_missed;  // Globals found missing through SyncerStatus
  std::vector<uint64_t> globals_refused; // Globals refused for a non-finite update
  std::vector<int> incarnations;
  std::vector<uint32_t> param_crc32c;  // ddp: CRC32C of each learner's final parameters
  // train.ranks > 1: per learner, each rank's parameters when its loop ended (LearnerResult).
  std::vector<std::vector<uint32_t>> rank_param_crc32c;
};

Status RunLocal(const TrainOptions& options, TrainSummary* summary, const LocalRunHooks& hooks = {},
                LocalRunDetails* details = nullptr);

}  // namespace diloco
