// When the syncer closes a fragment's round: a pure decision with the clock
// injected (no clock is read here), so every case is a table row in a test.
//
// A round collects learner deltas for one fragment. It closes (merge) when
// at least the quorum K has contributed and either every live learner is in
// or the adaptive grace window since quorum has passed:
//   grace = clamp(γ·(τ·ξ_step − ξ_quorum − ξ_sync), 0, cap)
// with ξ the EMAs of a learner's step time, the time from round open to
// quorum, and the time to merge and broadcast. The window also stretches, up
// to the cap, to the forecast arrival of any live learner whose delta is
// due (the syncer forecasts it from the learner's heartbeat: steps until the
// fragment fires × its step time). Learners that run a few steps apart (they
// joined at different times) then still land in the same round instead of
// splitting every round in two; a straggler whose delta is due later than
// the cap is not waited for. The lock-step modes (diloco,
// streaming; ddp too) wait for every live learner and have no grace window.
// A learner is live while it was heard from (heartbeat or any message)
// within the heartbeat timeout; failed learners drop out of the quorum
// (K is capped at the number of live learners), so the global model never
// stops while anyone trains.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config/sync_config.h"

namespace diloco {

using SyncClock = std::chrono::steady_clock;
using SyncTime = SyncClock::time_point;

// Exponential moving average; empty until its first sample, which it takes
// as is.
class Ema {
 public:
  explicit Ema(double weight = 0.2) : weight_(weight) {}  // weight of each new sample
  void Add(double sample) {
    value_ = has_value_ ? value_ + weight_ * (sample - value_) : sample;
    has_value_ = true;
  }
  bool has_value() const { return has_value_; }
  double value() const { return value_; }  // 0 when empty

 private:
  double weight_;
  double value_ = 0;
  bool has_value_ = false;
};

// The syncer's running estimates (milliseconds), fed by the syncer loop.
struct RoundTimings {
  Ema step_ms;    // ξ_step: a learner's inner step time (from heartbeats)
  Ema quorum_ms;  // ξ_quorum: round open (first contribution) -> quorum
  Ema sync_ms;    // ξ_sync: merge + broadcast
};

struct DecideOptions {
  SyncMode mode = SyncMode::kDecoupled;
  int quorum = 1;            // K (decoupled only)
  int overlap_steps = 2;     // τ
  double grace_gamma = 0.5;  // γ
  double grace_cap_ms = 2000;
  double grace_cap_steps = 0;       // > 0: the cap is at most this many of the fleet's steps
  bool grace_slowest_step = true;   // ξ_step: the slowest live learner's (else the heartbeats' EMA)
  bool grace_forecast = true;       // wait (up to the cap) for live learners whose delta is due
  double grace_straggler_ratio = 0;  // > 0: not for learners this many times slower than the fleet
  int64_t heartbeat_timeout_ms = 3000;
};

// What the syncer knows of one learner in this round.
struct LearnerPresence {
  int learner = 0;
  SyncTime last_heard;                     // last heartbeat or any message
  std::optional<SyncTime> contributed_at;  // its delta for this round arrived then
  std::optional<SyncTime> expected_at;     // forecast arrival of its delta (none: unknown)
  double step_ms = 0;                      // its last reported inner step time (0: unknown)
};

struct RoundState {
  std::vector<LearnerPresence> learners;  // every learner the syncer knows of
  RoundTimings timings;
};

enum class DecideAction { kWait, kMerge };

enum class DecideReason {
  kNoContributions,  // wait: nothing to merge yet
  kBelowQuorum,      // wait: fewer than K contributions
  kWaitingForAll,    // wait (lock-step modes): some live learner has not contributed
  kGraceRunning,     // wait: quorum reached, waiting up to the grace window for the rest
  kAwaitingDue,      // wait: quorum reached, a live learner's delta is due within the cap
  kAllLiveIn,        // merge: every live learner has contributed
  kGraceExpired,     // merge: quorum reached and the grace window has passed
  kNoGrace,          // merge: quorum reached and the grace window is 0
};
const char* ToString(DecideReason reason);

struct Decision {
  DecideAction action = DecideAction::kWait;
  DecideReason reason = DecideReason::kNoContributions;
  // Decide again at this time even if nothing arrives (grace end, or a
  // missing learner's heartbeat timing out); SyncTime::max() = only on news.
  SyncTime wait_until = SyncTime::max();
  int contributions = 0;
  int live = 0;         // learners heard from within the timeout
  int quorum = 0;       // K in force: min(K, live), at least 1
  double grace_ms = 0;  // the window in force from quorum (0 outside decoupled mode)
  int awaited = 0;      // live learners whose forecast arrival stretched the window
  SyncTime decided_at{};  // the `now` it was decided at
  // One line for logs: counts and times. Built on demand: Decide runs at every message the
  // syncer takes, a log line is wanted rarely.
  std::string detail() const;
};

// What the syncer decides with for a run's sync settings (the daemon and the simulator alike).
DecideOptions DecideOptionsFor(const SyncConfig& sync);

// ξ_step in force: the slowest live learner's last reported step time (with
// grace_slowest_step, once one has reported), else the heartbeats' EMA; none
// while nothing is known.
std::optional<double> GraceStepMs(SyncTime now, const RoundState& state, const DecideOptions& options);

// The lower median of values (the faster of the middle two of an even count); values not empty.
template <typename T>
T LowerMedian(std::vector<T> values) {
  const auto mid = values.begin() + (long)(values.size() - 1) / 2;
  std::nth_element(values.begin(), mid, values.end());
  return *mid;
}

// The fleet's pace: the median step time the live learners report (the lower one of an even
// count), else the heartbeats' EMA; none while nothing is known. The cap's step: a cap meant to
// bound the wait for learners slower than the fleet must not grow with the slowest of them
// (counted in a 3x slow learner's steps, cap_steps would let every round wait 3x as long).
std::optional<double> FleetStepMs(SyncTime now, const RoundState& state, const DecideOptions& options);

// The window's cap: grace_cap_ms, and at most grace_cap_steps × step_ms (the
// fleet's step, FleetStepMs) when both are known.
double GraceCapMs(std::optional<double> step_ms, const DecideOptions& options);

// clamp(γ·(τ·ξ_step − ξ_quorum − ξ_sync), 0, cap), ξ_step = step_ms or, when
// not given, the timings' EMA; the cap's step cap_step_ms (else ξ_step); the cap
// while no step time is known yet (nothing says the wait is too long).
double GraceWindowMs(const RoundTimings& timings, const DecideOptions& options,
                     std::optional<double> step_ms = std::nullopt,
                     std::optional<double> cap_step_ms = std::nullopt);

Decision Decide(SyncTime now, const RoundState& state, const DecideOptions& options);

// A delta is merged only when its base version is at most max_staleness
// versions behind the fragment's current version; a base from the future
// (the syncer restarted from an older checkpoint) is dropped too, and its
// learner must resync from a snapshot.
enum class StalenessVerdict { kFresh, kTooStale, kFromTheFuture };
const char* ToString(StalenessVerdict verdict);

struct StalenessCheck {
  StalenessVerdict verdict = StalenessVerdict::kFresh;
  uint64_t staleness = 0;  // current - base (0 when from the future)
  bool accepted() const { return verdict == StalenessVerdict::kFresh; }
};

StalenessCheck CheckStaleness(uint64_t current_version, uint64_t base_version, int max_staleness);

// A delta's counts weigh it in the merge (c_tokens² / c_steps), so they are checked against what
// the syncer knows of the run instead of taken on trust: c_steps in [1, learner_step] (the steps
// since its base cannot exceed all the learner's steps), learner_step <= max_steps (train.steps),
// and c_tokens <= c_steps × tokens_per_step (every step takes ranks × batch_size × block_size
// tokens). A limit of 0 is not checked.
struct CountLimits {
  uint64_t max_steps = 0;
  uint64_t tokens_per_step = 0;
};
enum class CountsVerdict { kPlausible, kNoSteps, kMoreStepsThanLearner, kPastTheRun, kTooManyTokens };
const char* ToString(CountsVerdict verdict);
CountsVerdict CheckCounts(uint64_t c_steps, uint64_t c_tokens, uint64_t learner_step, const CountLimits& limits);

}  // namespace diloco
