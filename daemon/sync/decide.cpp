#include "daemon/sync/decide.h"

#include <algorithm>
#include <cstdio>

namespace diloco {
namespace {

using Ms = std::chrono::duration<double, std::milli>;

SyncTime Later(SyncTime t, double ms) {
  return t + std::chrono::duration_cast<SyncClock::duration>(Ms(ms));
}

bool IsLive(SyncTime now, const LearnerPresence& l, const DecideOptions& options) {
  return now - l.last_heard <= std::chrono::milliseconds(options.heartbeat_timeout_ms);
}

// Slower than straggler_ratio x the fleet's step: the forecast does not wait for it (a learner
// slowed 3x for 20 s held every round to its pace, the merges 2.2 s apart at 0.7 s expected).
bool IsStraggler(const LearnerPresence& l, std::optional<double> fleet_step_ms, const DecideOptions& options) {
  return options.grace_straggler_ratio > 0 && fleet_step_ms && l.step_ms > options.grace_straggler_ratio * *fleet_step_ms;
}

// When the earliest live learner that has not contributed stops counting as
// live: the decision may change then.
SyncTime NextTimeout(SyncTime now, const RoundState& state, const DecideOptions& options) {
  SyncTime next = SyncTime::max();
  for (const LearnerPresence& l : state.learners) {
    if (l.contributed_at || !IsLive(now, l, options)) continue;
    // Live until last_heard + timeout inclusive; it is dead just after.
    const SyncTime dead_at = l.last_heard +
                             std::chrono::milliseconds(options.heartbeat_timeout_ms) +
                             SyncClock::duration(1);
    next = std::min(next, dead_at);
  }
  return next;
}

}  // namespace

std::string Decision::detail() const {
  char line[160];
  std::snprintf(line, sizeof line, "%d contributed, %d live, quorum %d, grace %.0f ms, %d due", contributions, live,
                quorum, grace_ms, awaited);
  std::string out = line;
  if (action == DecideAction::kWait && wait_until != SyncTime::max()) {
    std::snprintf(line, sizeof line, ", decide again in %.0f ms", Ms(wait_until - decided_at).count());
    out += line;
  }
  return out;
}

const char* ToString(DecideReason reason) {
  switch (reason) {
    case DecideReason::kNoContributions:
      return "no_contributions";
    case DecideReason::kBelowQuorum:
      return "below_quorum";
    case DecideReason::kWaitingForAll:
      return "waiting_for_all";
    case DecideReason::kGraceRunning:
      return "grace_running";
    case DecideReason::kAwaitingDue:
      return "awaiting_due";
    case DecideReason::kAllLiveIn:
      return "all_live_in";
    case DecideReason::kGraceExpired:
      return "grace_expired";
    case DecideReason::kNoGrace:
      return "no_grace";
  }
  return "invalid";
}

const char* ToString(StalenessVerdict verdict) {
  switch (verdict) {
    case StalenessVerdict::kFresh:
      return "fresh";
    case StalenessVerdict::kTooStale:
      return "too_stale";
    case StalenessVerdict::kFromTheFuture:
      return "from_the_future";
  }
  return "invalid";
}

DecideOptions DecideOptionsFor(const SyncConfig& sc) {
  DecideOptions o;
  o.mode = sc.mode;
  o.quorum = EffectiveQuorum(sc);
  o.overlap_steps = sc.overlap;
  o.grace_gamma = sc.grace.gamma;
  o.grace_cap_ms = sc.grace.cap_ms;
  o.grace_cap_steps = sc.grace.cap_steps;
  o.grace_slowest_step = sc.grace.step_time == GraceStepTime::kSlowest;
  o.grace_forecast = sc.grace.forecast;
  o.grace_straggler_ratio = sc.grace.straggler_ratio;
  o.heartbeat_timeout_ms = sc.heartbeat_timeout_ms;
  return o;
}

std::optional<double> GraceStepMs(SyncTime now, const RoundState& state, const DecideOptions& options) {
  if (options.grace_slowest_step) {
    double slowest = 0;
    for (const LearnerPresence& l : state.learners)
      if (IsLive(now, l, options)) slowest = std::max(slowest, l.step_ms);
    if (slowest > 0) return slowest;
  }
  if (state.timings.step_ms.has_value()) return state.timings.step_ms.value();
  return std::nullopt;
}

std::optional<double> FleetStepMs(SyncTime now, const RoundState& state, const DecideOptions& options) {
  std::vector<double> steps;
  for (const LearnerPresence& l : state.learners)
    if (IsLive(now, l, options) && l.step_ms > 0) steps.push_back(l.step_ms);
  if (steps.empty()) {
    if (state.timings.step_ms.has_value()) return state.timings.step_ms.value();
    return std::nullopt;
  }
  return LowerMedian(std::move(steps));  // with two learners, the faster one's pace
}

double GraceCapMs(std::optional<double> step_ms, const DecideOptions& options) {
  double cap = std::max(0.0, options.grace_cap_ms);
  if (options.grace_cap_steps > 0 && step_ms) cap = std::min(cap, options.grace_cap_steps * *step_ms);
  return cap;
}

double GraceWindowMs(const RoundTimings& timings, const DecideOptions& options, std::optional<double> step_ms,
                     std::optional<double> cap_step_ms) {
  if (!step_ms && timings.step_ms.has_value()) step_ms = timings.step_ms.value();
  const double cap = GraceCapMs(cap_step_ms ? cap_step_ms : step_ms, options);
  if (!step_ms) return cap;
  const double slack = options.overlap_steps * *step_ms - timings.quorum_ms.value() - timings.sync_ms.value();
  return std::clamp(options.grace_gamma * slack, 0.0, cap);
}

Decision Decide(SyncTime now, const RoundState& state, const DecideOptions& options) {
  Decision d;
  std::vector<SyncTime> arrivals;
  bool all_live_in = true;
  for (const LearnerPresence& l : state.learners) {
    const bool live = IsLive(now, l, options);
    d.live += live;
    if (l.contributed_at) {
      arrivals.push_back(*l.contributed_at);
    } else if (live) {
      all_live_in = false;
    }
  }
  d.contributions = static_cast<int>(arrivals.size());
  const bool decoupled = options.mode == SyncMode::kDecoupled;
  // Lock-step modes wait for every live learner: K is everyone alive.
  const int wanted =
      decoupled ? std::max(1, options.quorum) : static_cast<int>(state.learners.size());
  d.quorum = std::max(1, std::min(wanted, d.live));
  const std::optional<double> step_ms = decoupled ? GraceStepMs(now, state, options) : std::nullopt;
  const std::optional<double> fleet_step_ms = decoupled ? FleetStepMs(now, state, options) : std::nullopt;
  d.grace_ms = decoupled ? GraceWindowMs(state.timings, options, step_ms, fleet_step_ms) : 0;

  auto finish = [&](DecideAction action, DecideReason reason, SyncTime wait_until) {
    d.action = action;
    d.reason = reason;
    d.wait_until = action == DecideAction::kMerge ? now : wait_until;
    d.decided_at = now;
    return d;
  };
  if (d.contributions == 0) {
    return finish(DecideAction::kWait, DecideReason::kNoContributions, SyncTime::max());
  }
  if (all_live_in) return finish(DecideAction::kMerge, DecideReason::kAllLiveIn, now);
  // Someone live is missing; a timeout may lower the quorum or end the wait.
  const SyncTime timeout = NextTimeout(now, state, options);
  if (!decoupled) return finish(DecideAction::kWait, DecideReason::kWaitingForAll, timeout);
  if (d.contributions < d.quorum) {
    return finish(DecideAction::kWait, DecideReason::kBelowQuorum, timeout);
  }
  // The grace window runs from the arrival that made the quorum; it stretches
  // (up to the cap) to the latest forecast arrival of a live learner.
  std::sort(arrivals.begin(), arrivals.end());
  const SyncTime quorum_at = arrivals[d.quorum - 1];
  const SyncTime cap_end = Later(quorum_at, GraceCapMs(fleet_step_ms, options));
  SyncTime grace_end = Later(quorum_at, d.grace_ms);
  bool due_later = false;
  for (const LearnerPresence& l : state.learners) {
    if (!options.grace_forecast || l.contributed_at || !l.expected_at || !IsLive(now, l, options)) continue;
    if (*l.expected_at > cap_end) continue;  // due too late: not waited for
    if (IsStraggler(l, fleet_step_ms, options)) continue;
    d.awaited++;
    if (*l.expected_at > grace_end) {
      grace_end = *l.expected_at;
      due_later = true;
    }
  }
  d.grace_ms = Ms(grace_end - quorum_at).count();
  if (d.grace_ms <= 0) return finish(DecideAction::kMerge, DecideReason::kNoGrace, now);
  if (now >= grace_end) return finish(DecideAction::kMerge, DecideReason::kGraceExpired, now);
  const DecideReason why = due_later ? DecideReason::kAwaitingDue : DecideReason::kGraceRunning;
  return finish(DecideAction::kWait, why, std::min(grace_end, timeout));
}

const char* ToString(CountsVerdict verdict) {
  switch (verdict) {
    case CountsVerdict::kPlausible: return "plausible";
    case CountsVerdict::kNoSteps: return "no_steps";
    case CountsVerdict::kMoreStepsThanLearner: return "more_steps_than_learner";
    case CountsVerdict::kPastTheRun: return "past_the_run";
    case CountsVerdict::kTooManyTokens: return "too_many_tokens";
  }
  return "invalid";
}

CountsVerdict CheckCounts(uint64_t c_steps, uint64_t c_tokens, uint64_t learner_step, const CountLimits& limits) {
  if (c_steps == 0) return CountsVerdict::kNoSteps;
  if (c_steps > learner_step) return CountsVerdict::kMoreStepsThanLearner;
  if (limits.max_steps > 0 && learner_step > limits.max_steps) return CountsVerdict::kPastTheRun;
  if (limits.tokens_per_step > 0) {
    // c_tokens > c_steps × tokens_per_step, without the product (it could overflow).
    const uint64_t whole = c_tokens / limits.tokens_per_step, rest = c_tokens % limits.tokens_per_step;
    if (whole > c_steps || (whole == c_steps && rest > 0)) return CountsVerdict::kTooManyTokens;
  }
  return CountsVerdict::kPlausible;
}

StalenessCheck CheckStaleness(uint64_t current_version, uint64_t base_version, int max_staleness) {
  StalenessCheck check;
  if (base_version > current_version) {
    check.verdict = StalenessVerdict::kFromTheFuture;
    return check;
  }
  check.staleness = current_version - base_version;
  if (check.staleness > static_cast<uint64_t>(std::max(0, max_staleness))) {
    check.verdict = StalenessVerdict::kTooStale;
  }
  return check;
}

}  // namespace diloco
