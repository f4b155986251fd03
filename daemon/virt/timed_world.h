// A simulated deployment (`dilococtl simulate`'s DiLoCo modes): the virtual runtime with the
// maths off. The scheduler, the network and the real SyncerCore of every syncer shard
// (VirtualSyncer, each merging on its own host at timing.merge_gbps) as in a virtual run, but the learners are TimedLearners on the scheduler's thread, all roles hold a tiny model
// with the run's fragment count, and the links and the merges are charged the real model's
// sizes. One thread drives it all; nothing here reads the machine's clock.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/virt/scheduler.h"
#include "daemon/virt/timed_learner.h"
#include "daemon/virt/virtual_network.h"
#include "daemon/virt/virtual_syncer.h"
#include "kernels/gpt.h"

namespace diloco {

struct TimedWorldOptions {
  const RunConfig* config = nullptr;  // the run's (its model sizes the tokens; timing the steps and links)
  // Per fragment of the run's real model: a Delta's and a Global's bytes on the wire (its codecs),
  // and its fp32 bytes (what a merge reads per contributor).
  std::vector<double> delta_bytes, global_bytes, merge_bytes;
  double window_s = 60;  // links count their bytes per window of this length (the peak)
  // The run stops at this virtual time; 0: once every learner did train.steps and the syncer
  // heard them finish.
  double end_s = 0;
  // Scheduler thread, when learner i is up again after a kill (its new incarnation started).
  std::function<void(int learner)> on_restart;
};

class TimedWorld {
 public:
  static Status Create(const TimedWorldOptions& options, std::unique_ptr<TimedWorld>* out);

  Status Run();

  // At virtual time t_ns, learner i dies (unless it ended or is down) and, restart_after_ns later
  // (< 0: never), a new incarnation rejoins from a snapshot at the step it had reached.
  void KillLearnerAt(int64_t t_ns, int learner, int64_t restart_after_ns);

  VirtualScheduler& scheduler() { return scheduler_; }
  VirtualNetwork& network() { return *network_; }
  int shards() const { return (int)shards_.size(); }
  VirtualSyncer& syncer(int shard = 0) { return *shards_[shard]; }
  int learners() const { return (int)incarnations_.size(); }
  const std::vector<std::unique_ptr<TimedLearner>>& incarnations(int i) const { return incarnations_[i]; }
  // Per learner: when it was down, [kill, restart) in virtual ns (restart -1: until the end).
  const std::vector<std::vector<std::pair<int64_t, int64_t>>>& down_spans() const { return down_; }
  uint64_t kills() const { return kills_; }

 private:
  TimedWorld() = default;
  void StartLearner(int i, bool join_from_snapshot, long start_step);
  void KillLearner(int i, int64_t restart_after_ns);
  bool AllEnded() const;
  bool AllShardsDone() const;
  std::string Describe();

  TimedWorldOptions options_;
  GptConfig model_;
  std::vector<float> init_;
  VirtualScheduler scheduler_;
  std::unique_ptr<VirtualNetwork> network_;
  std::vector<std::unique_ptr<VirtualSyncer>> shards_;  // sync.syncers
  std::vector<std::vector<std::unique_ptr<TimedLearner>>> incarnations_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> down_;
  std::vector<int> pending_restarts_;
  uint64_t kills_ = 0;
};

}  // namespace diloco
