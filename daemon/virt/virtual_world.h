// Everything of a virtual run but its files and its summary: the scheduler, the network, the
// syncer shards (sync.syncers, shards.h) and the learners (each a series of incarnations), and
// the faults that tests and `dilococtl dst` schedule on them. One thread drives it (Run); learners' threads run only when
// it hands them the baton.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/sync/merge_tape.h"
#include "daemon/train/run_dir.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/virt/baton.h"
#include "daemon/virt/scheduler.h"
#include "daemon/virt/virtual_learner.h"
#include "daemon/virt/virtual_network.h"
#include "daemon/virt/virtual_syncer.h"
#include "kernels/tensor_table.h"

namespace diloco {

// A run config's model as a world's options point to it: its tensor table and version 0 (from
// train.seed).
struct VirtualModel {
  TensorTable table;
  std::vector<float> init;
};
VirtualModel VirtualModelOf(const RunConfig& cfg);

struct VirtualWorldOptions {
  const RunConfig* config = nullptr;
  std::string run_dir;                 // events.log, global_state.bin, learner-<i>.step ("" = none)
  const TensorTable* table = nullptr;  // the model's
  const float* init_params = nullptr;  // version 0 of every fragment
  int threads = 1;                     // OpenMP threads of each learner (all computes alone)
  LearnerMetricsFiles* metrics = nullptr;  // learners' lines (one actor at a time); may be null
  // The run is an error past this much virtual time (0: no limit): a stuck run ends, not hangs.
  double max_virtual_s = 0;
  // Scheduler thread, after every event: a non-OK status stops the run with it (DST's checks).
  std::function<Status()> after_event;
  // The syncer keeps its update log and checkpoints in run_dir (needed by KillSyncerAt).
  bool durable_syncer = false;
};

class VirtualWorld {
 public:
  static Status Create(const VirtualWorldOptions& options, std::unique_ptr<VirtualWorld>* out);
  ~VirtualWorld();  // a run that ended early: every learner still on its thread unwinds

  // Until every learner's last incarnation ended and every syncer shard heard them finish (a
  // heartbeat timeout of virtual time at most after that), or an error.
  Status Run();
  // After Run: every shard merges what is pending; global_state.bin is the run's joined state.
  Status FinishSyncers();
  // The run's global state, joined from the shards' (JoinShardStates), and its parameters.
  GlobalState JoinedState() const;
  void GlobalParams(float* flat) const;

  // Faults, at virtual time t_ns (scheduled before or during Run). restart_after_ns < 0: never.
  void KillLearnerAt(int64_t t_ns, int learner, int64_t restart_after_ns);
  void PartitionAt(int64_t t_ns, int learner, int64_t heal_after_ns);
  // Syncer shard `shard` dies (a kill -9: its timers, what waited for it and what was on its way
  // to it are gone) and a new incarnation resumes from its update log restart_after_ns later
  // (>= 0; durable_syncer only). A kill that comes during a merge lands at the merge's end: the
  // merge, its update log record and its Global are one step of the core.
  void KillSyncerAt(int64_t t_ns, int64_t restart_after_ns, int shard = 0);
  // A role's steady clock steps forward by jump_ns (learner < 0: syncer shard -1 - learner's):
  // dst.h's model.
  void JumpClockAt(int64_t t_ns, int learner, int64_t jump_ns);
  // Called with every Global any shard publishes (DST's checks), across restarts.
  void OnGlobal(std::function<void(const GlobalMsg&)> fn);

  VirtualScheduler& scheduler() { return scheduler_; }
  VirtualNetwork& network() { return *network_; }
  int shards() const { return (int)shards_.size(); }
  VirtualSyncer& syncer(int shard = 0) { return *shards_[shard]; }  // not while it is down (kill to restart)
  bool syncer_running(int shard = 0) const { return shards_[shard] != nullptr; }
  const MergeTape& merge_tape() const { return merge_tape_; }  // every incarnation's merges
  int learners() const { return (int)incarnations_.size(); }
  // Learner i's incarnations, in order (the last may still run during Run).
  const std::vector<std::unique_ptr<VirtualLearner>>& incarnations(int i) const { return incarnations_[i]; }
  // Per learner: when it was down ([kill, restart) in Unix ms; restart 0 = until the end).
  const std::vector<std::vector<std::pair<int64_t, int64_t>>>& down_spans() const { return down_; }
  // What the syncer and every learner are doing, in one line.
  std::string Describe();
  // When the last learner ended (virtual ns; -1 while one runs).
  int64_t all_ended_ns() const { return all_ended_ns_; }
  // Per learner: when its last incarnation ended with no restart to come (virtual ns; -1: not yet).
  const std::vector<int64_t>& ended_ns() const { return ended_ns_; }
  // When the shards' incarnations after the first started (virtual ns).
  const std::vector<int64_t>& syncer_restarts_ns() const { return syncer_restarts_ns_; }

 private:
  VirtualWorld() = default;
  void StartLearner(int i, bool join_from_snapshot, long start_step);
  void KillLearner(int i, int64_t restart_after_ns);
  void KillSyncer(int shard, int64_t restart_after_ns);
  void RestartSyncer(int shard);
  Status CreateShard(int shard, bool resume);
  bool AllEnded() const;
  bool AllShardsUp() const;
  bool AllShardsDone() const;

  VirtualWorldOptions options_;
  VirtualScheduler scheduler_;
  Baton baton_;
  std::unique_ptr<VirtualNetwork> network_;
  MergeTape merge_tape_;  // before shards_: it outlives the syncers that feed it
  std::vector<std::unique_ptr<VirtualSyncer>> shards_;  // null while down
  std::vector<std::vector<std::unique_ptr<VirtualLearner>>> incarnations_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> down_;
  std::vector<int> pending_restarts_;  // per learner: restarts scheduled, not yet done
  int64_t all_ended_ns_ = -1;
  std::vector<int64_t> ended_ns_;
  std::vector<int64_t> syncer_restarts_ns_;
  std::vector<int64_t> clock_offset_ns_;  // per learner: its clock's jumps so far
  std::vector<uint64_t> syncer_starts_;   // per shard: its restarts so far
  std::function<void(const GlobalMsg&)> on_global_;  // every shard's, kept across restarts
  Status error_;  // a restart that failed
};

}  // namespace diloco
