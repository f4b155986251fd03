// The syncer of a virtual run: the same SyncerCore as a daemon's or local mode's syncer, on the
// scheduler's thread. A merge keeps it busy for the fragment's fp32 bytes times its contributors
// over timing.merge_gbps: what it publishes leaves then, and what arrives meanwhile waits. The
// core's clock is the scheduler's, later by the merge in progress (and by a jump of its own clock:
// JumpClock). Merges go to events.log as in every runtime; the final global state to
// global_state.bin. A durable one also keeps the wall syncer's update log and checkpoints in
// run_dir (synchronously: they cost no virtual time), so that a next incarnation can resume from
// them (options.resume) at exactly the versions published (VirtualWorld::KillSyncerAt).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/net/envelope.h"
#include "daemon/net/sequence.h"
#include "daemon/sync/event_log.h"
#include "daemon/sync/syncer.h"
#include "daemon/sync/syncer_core.h"
#include "daemon/sync/syncer_store.h"
#include "daemon/config/run_config.h"
#include "daemon/virt/scheduler.h"
#include "daemon/virt/virtual_network.h"

namespace diloco {

// The options of syncer shard `shard` of a virtual run of cfg (events.log and global_state.bin in
// run_dir; "" none).
SyncerOptions VirtualSyncerOptions(const RunConfig& cfg, const std::string& run_dir, int shard = 0);

class VirtualSyncer final : public SyncerPort {
 public:
  // options: as for Syncer::Create (endpoints unused; resume needs durable). durable: keep the
  // update log and checkpoints in options.run_dir. start: 0 for the first incarnation, n for the
  // n-th restart (its incarnation number differs).
  static Status Create(VirtualScheduler& scheduler, VirtualNetwork& network, const SyncerOptions& options,
                       double merge_gbps, const TensorTable& table, const float* init_params,
                       std::unique_ptr<VirtualSyncer>* out, bool durable = false, uint64_t start = 0);
  ~VirtualSyncer() override;  // cancels its timers: a killed syncer does nothing more

  // Scheduler thread, at the arrival time.
  void OnUplink(int learner, const std::string& topic, net::Message&& m);
  void OnRequest(int learner, net::Message&& m);
  // `dilococtl simulate`: a tiny model stands in for a real one. A Global of fragment p then
  // travels as global_bytes[p] and its merge costs merge_bytes[p] (the real fragment's fp32
  // bytes) per contributor.
  void ChargeAs(std::vector<double> global_bytes, std::vector<double> merge_bytes) {
    charged_global_bytes_ = std::move(global_bytes);
    charged_merge_bytes_ = std::move(merge_bytes);
  }
  // Starts the core's timers.
  void Start();
  bool AllDone() const { return core_->AllDone(); }
  // A merge keeps it busy until then (virtual ns): what it publishes leaves then.
  int64_t busy_until_ns() const { return busy_until_ns_; }
  // Its clock steps forward by jump_ns (dst.h: a paused VM resumed); what was due in between is
  // due at once. Never back.
  void JumpClock(int64_t jump_ns);
  // The end: merges what is pending, writes global_state.bin.
  Status Finish();
  // The first error of the core (the run stops on it).
  const Status& error() const { return error_; }

  const std::vector<Fragment>& fragments() const { return fragments_; }
  const GlobalState& state() const { return state_; }
  uint64_t bytes_published() const { return bytes_published_; }
  uint64_t bytes_received() const { return bytes_received_; }
  // The fragments this shard merges, into the flat parameters (the others are left as they are).
  void GlobalParams(float* flat) const;
  const ShardMap& shards() const { return shards_; }
  int shard() const { return options_.shard; }
  std::vector<MergeEvent>& merges() { return merges_; }
  // Called with every Global as it is published (its version, CRC and contributors): DST's checks.
  std::function<void(const GlobalMsg&)> on_global;

  // One line per fragment and learner of what the syncer holds (a stuck run's report).
  std::string Describe();

  // SyncerPort
  SyncTime Now() override {
    return VirtualScheduler::ToSyncTime(std::max(scheduler_.now_ns(), busy_until_ns_) + clock_offset_ns_);
  }
  int64_t UnixMs() override { return VirtualScheduler::kEpochUnixMs + VirtualScheduler::ToNs(Now()) / 1000000; }
  void Publish(net::Message&& m) override;
  void Reply(const std::string& peer, net::Message&& m) override;
  Status LogUpdate(const UpdateRecord& record) override;
  void OnMerge(const MergeEvent& event) override;
  void Checkpoint(const GlobalState& state) override;
  void Note(const std::string& line) override;

 private:
  VirtualSyncer(VirtualScheduler& scheduler, VirtualNetwork& network) : scheduler_(scheduler), network_(network) {}
  void Tick();          // the core's timers, then the next one
  void After(Status st);  // keeps the first error
  // While a merge is in progress: again waits for its end (true); else false.
  bool Busy(std::function<void()> again);
  void ScheduleDrain();
  void Drain();  // what waited for the merge, in arrival order, then Tick

  VirtualScheduler& scheduler_;
  VirtualNetwork& network_;
  SyncerOptions options_;
  double merge_bytes_per_ns_ = 10;
  std::vector<Fragment> fragments_;
  ShardMap shards_;
  GlobalState state_;
  std::unique_ptr<SyncerCore> core_;
  ParseOptions uplink_expect_, router_expect_, published_expect_;
  std::map<std::string, net::SequenceTracker> uplink_seq_;  // per topic (main and liveness streams)
  EventLog events_;
  bool have_events_ = false;
  std::vector<MergeEvent> merges_;
  std::vector<double> charged_global_bytes_, charged_merge_bytes_;  // ChargeAs; empty: the real sizes
  int64_t busy_until_ns_ = 0;
  int64_t clock_offset_ns_ = 0;  // JumpClock: the core's clock is ahead of the scheduler's by this
  std::unique_ptr<SyncerStore> store_;  // durable only with a run directory
  uint64_t timer_ = 0;
  int64_t timer_at_ns_ = -1;
  std::deque<std::function<void()>> deferred_;  // arrived during a merge, in arrival order
  uint64_t drain_timer_ = 0;
  bool draining_ = false;
  uint64_t bytes_published_ = 0, bytes_received_ = 0;
  Status error_;
};

}  // namespace diloco
