// Plays a chaos timeline (config/chaos_config.h: ExpandChaos) against a running job: actions
// at their time since the start, or when their learner reaches their step (then their follow-up,
// e.g. the restart, that many seconds later). What the actions do is the target's business:
// local mode kills and restarts learner threads and the syncer, and shapes the emulated links.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "daemon/config/chaos_config.h"

namespace diloco {

// One played action as a metrics.jsonl line: {"event": "chaos", "t_s", "action", "learner", "value"}.
nlohmann::json ChaosEventJson(double t_s, const ChaosAction& action);

class ChaosTarget {
 public:
  virtual ~ChaosTarget() = default;
  virtual void KillLearner(int learner) = 0;     // as if its site failed: no word from it after
  virtual void RestartLearner(int learner) = 0;  // a new incarnation, from a snapshot
  virtual void SetSlowdown(int learner, double factor) = 0;
  virtual void SetPartitioned(int learner, bool partitioned) = 0;
  virtual void SetLoss(int learner, double prob) = 0;     // learner -1: every link; 0: back to normal
  virtual void SetCorrupt(int learner, double prob) = 0;  // the same
  virtual void KillSyncer(int shard) = 0;  // shard -1: every shard
  virtual void RestartSyncer(int shard) = 0;
  virtual long LearnerStep(int learner) const = 0;
};

class ChaosRunner {
 public:
  // on_action (may be empty) hears every action as it is played, with its time since Start.
  ChaosRunner(std::vector<ChaosAction> actions, ChaosTarget* target,
              std::function<void(double t_s, const ChaosAction&)> on_action);
  ~ChaosRunner();  // Stop()

  void Start();  // t = 0 now; plays on its own thread
  void Stop();   // actions not played yet are dropped
  // A restart of the learner (or the syncer: -1) is still to come; for a learner, the end of a
  // partition counts too (it comes back).
  bool RestartPending(int learner) const;

 private:
  void Run();
  void Play(const ChaosAction& a, double t_s);

  ChaosTarget* target_;
  std::function<void(double, const ChaosAction&)> on_action_;
  mutable std::mutex mu_;
  std::vector<ChaosAction> pending_;  // guarded by mu_; time-triggered ones have step < 0
  bool playing_ = false;              // guarded by mu_: actions taken off pending_ being played
  std::chrono::steady_clock::time_point start_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace diloco
