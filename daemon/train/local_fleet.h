// The moving parts of a local multi-learner run: the syncer on a thread (LocalSyncer) and each
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

// Local mode's syncer: the daemon's syncer role (train/roles.h) as a series of incarnations.
class LocalSyncer {
 public:
  // Returns once the syncer is built (its sockets bound, a resumed state restored), or with
  // the error that kept it from starting.
  Status Start(net::NetContext& context, RoleOptions options);
  void Kill();     // as kill -9: nothing more is merged or saved (the update log remains)
  void Restart();  // from its run directory (global_state.bin + the update log)
  Status Stop();   // a clean end: merges what is pending, saves; the first error of any run
  // Null while killed. The pointer stays valid until the next Kill/Restart (the caller's thread).
  Syncer* get() const;
  SyncerStatusSnapshot CurrentStatus() const;

 private:
  Status StartRole(RoleOptions options);
  net::NetContext* context_ = nullptr;
  RoleOptions options_;
  mutable std::mutex mu_;  // guards role_ against Kill/Restart from the chaos thread
  std::unique_ptr<Role> role_;
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
  LocalFleet(net::NetContext& context, int learners, std::function<RoleOptions(int)> role_of, LocalSyncer* syncer,
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
  void KillSyncer() override { syncer_->Kill(); }
  void RestartSyncer() override { syncer_->Restart(); }
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
  LocalSyncer* syncer_;
  std::vector<std::shared_ptr<net::Link>> links_;
  net::LinkParams base_link_;
  mutable std::mutex mu_;  // guards slots_ (the chaos thread restarts while the main one waits)
  std::vector<Slot> slots_;
};

}  // namespace diloco
