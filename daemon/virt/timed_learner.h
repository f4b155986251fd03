// One learner of a simulated deployment (`dilococtl simulate`): the real LearnerCore with its
// maths off, living on the virtual scheduler's thread. No inner loop, no thread, no baton: a step
// is a scheduler event at its end, so a step costs the core's bookkeeping and nothing else.
//
// It makes the same calls on its core, in the same order, as the threaded VirtualLearner
// (virtual_learner.h) makes from its inner loop:
//   join:  OnJoinTimer, wait for a message (20 ms), deliver, until Joined; Start; while a
//          snapshot is awaited: OnTimer, wait (a heartbeat period), deliver; BeginTraining;
//   step:  deliver what arrived, OnTimer, BeforeStep; while Blocked (the ledger's lock-step
//          rule): wait for a message (a heartbeat period), deliver, OnTimer, BeforeStep again;
//          then the step's virtual duration (virtual_step.h) passes and AfterStep runs, and the
//          next step's BeforeStep at once;
//   end:   BeginFlush; wait until Flushed; SendRemaining; wait until Flushed; Finish.
// A message that arrives while it waits goes to the core at once; during a step, at the step's
// end. The liveness stream beats from a scheduler timer, as in every runtime, when the core's own
// heartbeat is older than a period.
//
// Its model is a tiny one (TimedModelFor: the run's fragment count, a few thousand parameters):
// no step changes a parameter, so every delta is zero, and the ledger, the cadence, the folds and
// the CRC checks run on the real code at no cost. What the real model costs in time is charged
// instead: a Delta of fragment p travels as delta_bytes[p] (the real fragment under the uplink
// codec); the syncer charges Globals and merges the same way (VirtualSyncer::ChargeAs).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/train/learner.h"
#include "daemon/train/learner_core.h"
#include "daemon/train/outer_state.h"
#include "daemon/virt/core_inbox.h"
#include "daemon/virt/scheduler.h"
#include "daemon/virt/virtual_network.h"
#include "kernels/backend.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"

namespace diloco {

// The tiny GPT every role of a simulation holds: enough tensors for `fragments` fragments (one
// layer has 12), 8 wide, so a fragment is a few hundred parameters.
GptConfig TimedModelFor(int fragments);

class TimedLearner final : public LearnerPort {
 public:
  // options: as for RunLearner (index, config, init_params, join_from_snapshot, start_step, ...);
  // options.config's model is the real one (tokens per step); model is the tiny one it holds.
  // delta_bytes[p]: what a Delta of fragment p costs on the link (empty: its own size).
  TimedLearner(VirtualScheduler& scheduler, VirtualNetwork& network, LearnerOptions options, const GptConfig& model,
               std::vector<double> delta_bytes, uint64_t incarnation);
  ~TimedLearner() override;

  // Starts at the scheduler's current time.
  void Launch();
  // Scheduler thread: a message arrived on the downlink / the DEALER.
  void DeliverDownlink(net::Message&& m) { Deliver(false, std::move(m)); }
  void DeliverDealer(net::Message&& m) { Deliver(true, std::move(m)); }
  // It dies where it is (a kill -9): its result says crashed, with the work that had not left.
  void Kill();

  bool done() const { return done_; }
  long steps_done() const { return steps_done_; }
  int64_t last_step_ns() const { return last_step_ns_; }
  // Since when its core has been blocked by the ledger (virtual ns), -1 when it is not: a wait
  // still open at a kill or at the end of the run, which its result does not hold yet.
  int64_t blocked_since_ns() const { return blocked_since_ns_; }
  const Status& status() const { return status_; }
  // What it did: at its end (finished or killed), or so far while it runs (a run stopped by the
  // clock ends with its learners still at work).
  const LearnerResult& result() const { return done_ || !core_ ? result_ : core_->result(); }
  std::string Describe() const;

  // LearnerPort
  SyncTime Now() override { return scheduler_.now(); }
  int64_t UnixMs() override { return scheduler_.unix_ms(); }
  void SendUplink(int shard, net::Message&& m) override;
  void SendDealer(int shard, net::Message&& m) override { network_.LearnerRequest(options_.index, shard, std::move(m)); }
  void OnHeartbeat(const HeartbeatMsg& hb) override;
  void SaveStep(long) override {}
  Status SaveMoments(long) override { return Status::Ok(); }
  void WriteMetrics(const nlohmann::json&) override {}
  void Note(const std::string&) override {}

 private:
  using Continue = std::function<Status()>;
  Status SetUp();
  Status JoinStep();
  Status SnapshotStep();
  Status StartTraining();
  Status NextStep();
  Status TryStep();
  Status StepEnd();
  Status FlushStep(int phase);
  Status DrainInbox();  // what arrived, to the core
  void Deliver(bool from_dealer, net::Message&& m);
  // Waits until a message arrives (at once when one is in) or timeout_ns pass, then runs then.
  void WaitThen(int64_t timeout_ns, Continue then);
  void Run(const Continue& step);  // runs a continuation; an error ends the learner with it
  void End();                      // cancels every timer
  void BeatLiveness();

  VirtualScheduler& scheduler_;
  VirtualNetwork& network_;
  const LearnerOptions options_;
  const RunConfig& cfg_;
  const std::string me_;
  const GptConfig model_;
  const std::vector<double> delta_bytes_;
  const uint64_t incarnation_;
  Rng step_rng_;
  ParseOptions uplink_check_;  // reads back a Delta's fragment, to charge it

  std::unique_ptr<TrainingBackend> backend_;
  std::unique_ptr<OuterState> outer_;
  std::unique_ptr<LearnerCore> core_;
  CoreInbox inbox_;
  int64_t joining_since_ns_ = 0;
  long step_ = 0;  // the step BeforeStep is at
  double step_base_s_ = 0;
  int64_t step_ns_ = 0;
  Continue waiting_;  // set while it waits for a message
  uint64_t wake_timer_ = 0, step_timer_ = 0, liveness_timer_ = 0;
  bool have_beat_ = false;
  HeartbeatMsg last_beat_;
  uint64_t liveness_seq_ = 0;
  int64_t last_core_beat_ns_ = 0;
  long steps_done_ = 0;
  int64_t last_step_ns_ = 0;
  int64_t blocked_since_ns_ = -1;
  bool done_ = false;
  Status status_;
  LearnerResult result_;
};

}  // namespace diloco
