// The moving parts of a local multi-learner run: the syncer on a thread (LocalSyncer) and each
// learner as a series of incarnations on threads (LocalFleet), so that chaos (chaos_runner.h)
// can kill and restart them, slow them down and cut or spoil their emulated links.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/net/context.h"
#include "daemon/net/link_shaper.h"
#include "daemon/sync/syncer.h"
#include "daemon/train/chaos_runner.h"
#include "daemon/train/learner.h"

namespace diloco {

class LocalSyncer {
 public:
  Status Start(net::NetContext& context, const SyncerOptions& options, const TensorTable& table,
               const float* init_params);
  void Kill();       // as kill -9: nothing more is merged or saved (the update log remains)
  void Restart();    // from its run directory (global_state.bin + the update log)
  Status Stop();     // a clean end: merges what is pending, saves; the first error of any run
  // Null while killed. The pointer stays valid until the next Kill/Stop (the caller's thread).
  Syncer* get() const { return syncer_.get(); }
  SyncerStatusSnapshot CurrentStatus() const;

 private:
  void RunThread();
  net::NetContext* context_ = nullptr;
  SyncerOptions options_;
  const TensorTable* table_ = nullptr;
  mutable std::mutex mu_;  // guards syncer_ against Kill/Restart from the chaos thread
  std::unique_ptr<Syncer> syncer_;
  std::thread thread_;
  Status status_;
};

class LocalFleet final : public ChaosTarget {
 public:
  // options_of(i): learner i's options for its first incarnation (restarts join from a snapshot
  // at the step the last one reached). links: one per learner, or empty (then no link chaos);
  // base_link: their parameters outside chaos.
  LocalFleet(net::NetContext& context, int learners, std::function<LearnerOptions(int)> options_of,
             LocalSyncer* syncer, std::vector<std::shared_ptr<net::Link>> links, net::LinkParams base_link);
  ~LocalFleet() override;

  void Start(int learner, LearnerOptions options);  // a new incarnation
  bool Ended(int learner) const;                    // its latest incarnation returned
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
    LearnerResult result;
    Status status;
    std::thread thread;
    std::atomic<bool> ended{false};
    int64_t killed_unix_ms = 0;
  };
  struct Slot {
    std::atomic<bool> crash{false};
    std::atomic<double> slowdown{1.0};
    std::atomic<long> step{0};
    std::vector<std::unique_ptr<Incarnation>> incarnations;  // guarded by mu_
  };
  void ShapeLinks(int learner, const std::function<void(net::LinkParams*)>& change);

  net::NetContext& context_;
  std::function<LearnerOptions(int)> options_of_;
  LocalSyncer* syncer_;
  std::vector<std::shared_ptr<net::Link>> links_;
  net::LinkParams base_link_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace diloco
