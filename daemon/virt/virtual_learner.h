// One learner of a virtual run (sync.clock: virtual): the same LearnerCore as a daemon's or local
// mode's learner, its ring and inner loop on a thread of its own, but driven by the virtual
// scheduler through the baton (baton.h): it runs only when the scheduler hands it the baton, at
// the scheduler's time. A step's maths runs for real; its duration is virtual (timing.step_ms ×
// learners[i].slowdown × jitter), and messages that arrive during it wait for the next step
// boundary, as a socket's would. Heartbeats of the liveness stream come from a scheduler timer,
// as from the wall runtime's liveness thread.
#pragma once

#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/net/envelope.h"
#include "daemon/net/sequence.h"
#include "daemon/train/learner.h"
#include "daemon/train/learner_core.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/virt/baton.h"
#include "daemon/virt/core_inbox.h"
#include "daemon/virt/scheduler.h"
#include "daemon/virt/virtual_network.h"
#include "kernels/rng.h"

namespace diloco {

class VirtualLearner final : public LearnerPort {
 public:
  // options: as for RunLearner (index, config, init_params, run_dir, ...; endpoints unused).
  VirtualLearner(VirtualScheduler& scheduler, Baton& baton, VirtualNetwork& network, LearnerOptions options,
                 uint64_t incarnation, JsonlWriter* metrics);
  ~VirtualLearner() override;

  // Starts the thread; the learner first runs at the scheduler's current time.
  void Launch();
  // Scheduler thread: a message arrived on the downlink / the DEALER.
  void DeliverDownlink(net::Message&& m);
  void DeliverDealer(net::Message&& m);

  // Scheduler thread, the learner waiting for its turn: it dies there (a kill -9): its result says
  // crashed, with the work that had not left in a delta; its thread unwinds and is joined.
  void Kill();

  // Scheduler thread: its clock steps forward by jump_ns (dst.h); the core sees it at its next look.
  void JumpClock(int64_t jump_ns) { clock_offset_ns_ += std::max<int64_t>(0, jump_ns); }

  // One line of what it is doing (a stuck run's report): step, state, blocked fragment, versions.
  std::string Describe() const;

  bool done() const { return done_; }
  long steps_done() const { return steps_done_; }
  int64_t last_step_ns() const { return last_step_ns_; }  // when its last step ended (virtual)
  // Requests it sent (Hello, SnapshotRequest) since its last step ended, to the syncer shard it
  // sent most to: at the end, each after the first is a snapshot asked again (a request or a
  // part lost on the way); the shards are asked again each on its own, at once.
  int requests_after_last_step() const {
    return *std::max_element(requests_after_last_step_.begin(), requests_after_last_step_.end());
  }
  const Status& status() const { return status_; }
  const LearnerResult& result() const { return result_; }

  // LearnerPort
  SyncTime Now() override { return VirtualScheduler::ToSyncTime(scheduler_.now_ns() + clock_offset_ns_); }
  int64_t UnixMs() override { return scheduler_.unix_ms() + clock_offset_ns_ / 1000000; }
  void SendUplink(int shard, net::Message&& m) override;
  void SendDealer(int shard, net::Message&& m) override;
  void OnHeartbeat(const HeartbeatMsg& hb) override;
  void SaveStep(long step) override;
  Status SaveMoments(long done) override;
  void WriteMetrics(const nlohmann::json& line) override;
  void Note(const std::string& line) override;

 private:
  class Hook;
  void ThreadMain();
  Status Run();
  Status RunLeader(LocalRing& ring, OuterState& outer, const BatchSampler& train, bool* loop_entered);
  Status Join();
  Status FlushAndFinish();
  // Actor thread: hand the baton back until t_ns / until a message arrives (or timeout_ns).
  // An error once the run was aborted (Baton::Abort): the learner unwinds.
  Status SleepUntil(int64_t t_ns);
  Status WaitForMessage(int64_t timeout_ns);
  Status Aborted() const;
  Status ProcessInbox();
  void BeatLiveness();  // scheduler thread: the liveness stream's beat, every heartbeat period
  int64_t StepNs();     // this step's virtual duration

  VirtualScheduler& scheduler_;
  Baton& baton_;
  VirtualNetwork& network_;
  const LearnerOptions options_;
  const RunConfig& cfg_;
  const std::string me_;
  const uint64_t incarnation_;
  JsonlWriter* metrics_;
  Rng step_rng_;

  std::unique_ptr<LearnerCore> core_;
  CoreInbox inbox_;
  bool waiting_ = false;         // in WaitForMessage: a delivery wakes it
  uint64_t wake_timer_ = 0;
  bool have_beat_ = false;
  HeartbeatMsg last_beat_;
  uint64_t liveness_seq_ = 0;
  uint64_t liveness_timer_ = 0;
  LocalRing* ring_ = nullptr;  // while Run runs (SaveMoments)
  double step_base_s_ = 0;      // the current step's time without slowdown and jitter
  long steps_done_ = 0;
  int64_t last_step_ns_ = 0;
  int64_t clock_offset_ns_ = 0;
  std::vector<int> requests_after_last_step_;  // per shard
  bool done_ = false;
  bool aborted_ = false;  // this thread's view: the baton said the run was aborted
  Status status_;
  LearnerResult result_;
  std::thread thread_;
};

}  // namespace diloco
