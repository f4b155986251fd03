// The moving parts of a local multi-learner run: the syncer shards on threads (LocalSyncers) and each
// learner as a series of incarnations of the daemon's learner role (LocalFleet), so that chaos
// (chaos_runner.h) can kill and restart them, slow them down and cut or spoil their links.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "daemon/net/context.h"
#include "daemon/net/link_shaper.h"
#include "daemon/sync/syncer.h"
#include "daemon/train/chaos_runner.h"
#include "daemon/train/learner.h"
#include "daemon/train/roles.h"

namespace diloco {

// Local mode's syncer: the daemon's syncer role (train/roles.h) for each shard (sync.syncers,
// shards.h), each a series of incarnations.
class LocalSyncers {
 public:
  // options.syncers: every shard's endpoints. Returns once every shard is built (its sockets
  // bound, a resumed state restored), or with the error that kept one from starting.
  Status Start(net::NetContext& context, RoleOptions options);
  int shards() const { return (int)options_.syncers.size(); }
  // shard -1: every shard.
  void Kill(int shard);     // as kill -9: nothing more is merged or saved (the update log remains)
  void Restart(int shard);  // from its store (global_state.bin + the update log); a live one stays
  Status Stop();            // a clean end: merges what is pending, saves; the first error of any run
  // Null while killed. The pointer stays valid until the next Kill/Restart (the caller's thread).
  Syncer* get(int shard) const;
  SyncerStatusSnapshot CurrentStatus(int shard) const;
  uint64_t Merges() const;  // every live shard's, now

 private:
  Status StartShard(int shard, const RoleOptions& options);  // with mu_ held
  Status AwaitBuilt(int shard);                              // the same
  net::NetContext* context_ = nullptr;
  RoleOptions options_;
  mutable std::mutex mu_;  // guards roles_ against Kill/Restart from the chaos thread
  std::vector<std::unique_ptr<Role>> roles_;  // per shard; null while killed
  Status status_;
};

// Local mode's learners: each the daemon's learner role (train/roles.h), run as a series of
// incarnations in this process, so that chaos can kill and restart them, slow them down and cut
// or spoil their emulated links.
class LocalFleet final : public ChaosTarget {
 public:
  // role_of(i): learner i's role for its first incarnation (a restart resumes from the syncer's
  // snapshot at the step the last one reached). links: one per learner, or empty (then no link
  // chaos); base_link: their parameters outside chaos.
  LocalFleet(net::NetContext& context, int learners, std::function<RoleOptions(int)> role_of, LocalSyncers* syncers,
             std::vector<std::shared_ptr<net::Link>> links, net::LinkParams base_link);
  ~LocalFleet() override;

  void Start(int learner, RoleOptions options);  // a new incarnation
  bool Ended(int learner) const;                 // its latest incarnation returned
  void WaitEnded(int learner);
  // Until every learner's latest incarnation has returned and none that crashed has a restart
  // coming (runner may be null).
  void JoinAll(const ChaosRunner* runner);
  // After JoinAll: every incarnation's result, and the first error of any.
  std::vector<std::vector<const LearnerResult*>> Results() const;
  Status FirstError() const;
  // When each learner was down (killed until its next incarnation trained), Unix ms.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> DownSpans() const;

  // ChaosTarget
  void KillLearner(int learner) override;
  void RestartLearner(int learner) override;
  void SetSlowdown(int learner, double factor) override;
  void SetPartitioned(int learner, bool partitioned) override;
  void SetLoss(int learner, double prob) override;
  void SetCorrupt(int learner, double prob) override;
  void KillSyncer(int shard) override { syncers_->Kill(shard); }
  void RestartSyncer(int shard) override { syncers_->Restart(shard); }
  long LearnerStep(int learner) const override;

 private:
  struct Incarnation {
    std::unique_ptr<Role> role;  // null when it could not start
    Status status;               // why not
    int64_t killed_unix_ms = 0;
    bool ended() const { return !role || role->done(); }
  };
  struct Slot {
    double slowdown = 1;  // chaos's, kept for the next incarnation
    std::vector<std::unique_ptr<Incarnation>> incarnations;
  };
  void ShapeLinks(int learner, const std::function<void(net::LinkParams*)>& change);

  net::NetContext& context_;
  std::function<RoleOptions(int)> role_of_;
  LocalSyncers* syncers_;
  std::vector<std::shared_ptr<net::Link>> links_;
  net::LinkParams base_link_;
  mutable std::mutex mu_;  // guards slots_ (the chaos thread restarts while the main one waits)
  std::vector<Slot> slots_;
};

}  // namespace diloco
