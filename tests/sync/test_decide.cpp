// Decide() as a table: each row is a round seen at a fake "now", with the
// expected action, reason and the time to decide again.
#include <catch2/catch.hpp>
#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "daemon/sync/decide.h"

namespace diloco {
namespace {

using std::chrono::milliseconds;

const SyncTime kNow = SyncTime() + std::chrono::hours(1);
constexpr int kNever = -1;
constexpr int64_t kForever = -1;

SyncTime Ago(int ms) { return kNow - milliseconds(ms); }

constexpr int kNoForecast = INT_MIN;

// One learner: how long ago it was heard from and contributed (kNever = no delta), and in how
// many ms its delta is forecast to arrive (negative: the forecast time has passed).
struct L {
  int heard_ms_ago;
  int contributed_ms_ago;
  int due_in_ms = kNoForecast;
};

struct Timings {
  std::optional<double> step_ms, quorum_ms, sync_ms;
};

struct Row {
  std::string name;
  SyncMode mode;
  int quorum;
  std::vector<L> learners;
  Timings timings;
  DecideAction action;
  DecideReason reason;
  int64_t wait_ms;  // wait_until - now in ms (rounded down); kForever = SyncTime::max()
  int expect_quorum;
  int expect_live;
};

RoundState StateOf(const std::vector<L>& learners, const Timings& t) {
  RoundState state;
  for (size_t i = 0; i < learners.size(); ++i) {
    LearnerPresence p;
    p.learner = (int)i;
    p.last_heard = Ago(learners[i].heard_ms_ago);
    if (learners[i].contributed_ms_ago != kNever)
      p.contributed_at = Ago(learners[i].contributed_ms_ago);
    if (learners[i].due_in_ms != kNoForecast) p.expected_at = Ago(-learners[i].due_in_ms);
    state.learners.push_back(p);
  }
  if (t.step_ms) state.timings.step_ms.Add(*t.step_ms);
  if (t.quorum_ms) state.timings.quorum_ms.Add(*t.quorum_ms);
  if (t.sync_ms) state.timings.sync_ms.Add(*t.sync_ms);
  return state;
}

DecideOptions OptionsOf(SyncMode mode, int quorum) {
  DecideOptions o;
  o.mode = mode;
  o.quorum = quorum;
  o.overlap_steps = 2;
  o.grace_gamma = 0.5;
  o.grace_cap_ms = 2000;
  o.heartbeat_timeout_ms = 3000;
  return o;
}

// τ·ξ_step − ξ_quorum − ξ_sync = 2·1000 − 200 − 300 = 1500; γ = 0.5 → 750 ms.
const Timings k750{1000.0, 200.0, 300.0};

TEST_CASE("sync: Decide: quorum, everyone in, grace window and liveness, with reasons",
          "[unit][sync]") {
  using A = DecideAction;
  using R = DecideReason;
  const SyncMode kDec = SyncMode::kDecoupled;
  // A live learner heard 500 ms ago times out 3000 ms after that: 2500 ms from now.
  const std::vector<Row> rows = {
      {"nothing arrived",
       kDec,
       1,
       {{10, kNever}, {10, kNever}},
       k750,
       A::kWait,
       R::kNoContributions,
       kForever,
       1,
       2},
      {"below quorum waits for a delta or a timeout",
       kDec,
       2,
       {{10, 10}, {100, kNever}, {500, kNever}},
       k750,
       A::kWait,
       R::kBelowQuorum,
       2500,
       2,
       3},
      {"every live learner in merges at once",
       kDec,
       1,
       {{10, 10}, {10, 20}, {10, 900}},
       k750,
       A::kMerge,
       R::kAllLiveIn,
       0,
       1,
       3},
      {"quorum of all merges when all are in",
       kDec,
       3,
       {{10, 10}, {10, 20}, {10, 30}},
       {},
       A::kMerge,
       R::kAllLiveIn,
       0,
       3,
       3},
      {"quorum reached: grace runs from the quorum arrival",
       kDec,
       1,
       {{10, 100}, {10, kNever}, {10, kNever}},
       k750,
       A::kWait,
       R::kGraceRunning,
       650,
       1,
       3},
      {"grace over: merge what is in",
       kDec,
       1,
       {{10, 800}, {10, kNever}, {10, kNever}},
       k750,
       A::kMerge,
       R::kGraceExpired,
       0,
       1,
       3},
      {"grace counts from the K-th arrival, not the first",
       kDec,
       2,
       {{10, 900}, {10, 100}, {10, kNever}},
       k750,
       A::kWait,
       R::kGraceRunning,
       650,
       2,
       3},
      {"grace ends early when the missing learner times out first",
       kDec,
       1,
       {{10, 100}, {2800, kNever}},
       k750,
       A::kWait,
       R::kGraceRunning,
       200,
       1,
       2},
      {"no slack: zero grace merges at quorum",
       kDec,
       1,
       {{10, 5}, {10, kNever}},
       {100.0, 500.0, 100.0},
       A::kMerge,
       R::kNoGrace,
       0,
       1,
       2},
      {"no step estimate yet: the cap",
       kDec,
       1,
       {{10, 1500}, {10, kNever}},
       {},
       A::kWait,
       R::kGraceRunning,
       500,
       1,
       2},
      {"a dead learner drops out of the quorum",
       kDec,
       2,
       {{10, 10}, {5000, kNever}},
       k750,
       A::kMerge,
       R::kAllLiveIn,
       0,
       1,
       1},
      {"quorum capped by the live, still short",
       kDec,
       3,
       {{10, 10}, {3500, kNever}, {500, kNever}},
       k750,
       A::kWait,
       R::kBelowQuorum,
       2500,
       2,
       2},
      {"a contributor that died still counts",
       kDec,
       2,
       {{3500, 3500}, {50, 50}, {10, kNever}},
       k750,
       A::kWait,
       R::kGraceRunning,
       700,
       2,
       2},
      {"heard exactly at the timeout is live",
       kDec,
       1,
       {{10, 10}, {3000, kNever}},
       {},
       A::kWait,
       R::kGraceRunning,
       0,
       1,
       2},
      {"a delta due within the cap stretches the window",
       kDec,
       1,
       {{10, 100}, {10, kNever, 1200}},
       k750,
       A::kWait,
       R::kAwaitingDue,
       1200,
       1,
       2},
      {"a delta due after the cap is not waited for",
       kDec,
       1,
       {{10, 100}, {10, kNever, 2500}},
       k750,
       A::kWait,
       R::kGraceRunning,
       650,
       1,
       2},
      {"no slack, but a delta due: wait for it",
       kDec,
       1,
       {{10, 5}, {10, kNever, 300}},
       {100.0, 500.0, 100.0},
       A::kWait,
       R::kAwaitingDue,
       300,
       1,
       2},
      {"the forecast arrival has passed: merge what is in",
       kDec,
       1,
       {{10, 1500}, {10, kNever, -100}},
       k750,
       A::kMerge,
       R::kGraceExpired,
       0,
       1,
       2},
      {"a dead learner's forecast is not waited for",
       kDec,
       1,
       {{10, 100}, {5000, kNever, 500}},
       k750,
       A::kMerge,
       R::kAllLiveIn,
       0,
       1,
       1},
      {"the forecast of a learner already in changes nothing",
       kDec,
       1,
       {{10, 10}, {10, 20, 900}},
       k750,
       A::kMerge,
       R::kAllLiveIn,
       0,
       1,
       2},
      {"diloco waits for every live learner",
       SyncMode::kDiloco,
       1,
       {{10, 10}, {10, 10}, {500, kNever}},
       k750,
       A::kWait,
       R::kWaitingForAll,
       2500,
       3,
       3},
      {"diloco merges once the missing one is dead",
       SyncMode::kDiloco,
       1,
       {{10, 10}, {10, 10}, {3001, kNever}},
       k750,
       A::kMerge,
       R::kAllLiveIn,
       0,
       2,
       2},
      {"streaming has no grace window",
       SyncMode::kStreaming,
       1,
       {{10, 10}, {10, 10}},
       k750,
       A::kMerge,
       R::kAllLiveIn,
       0,
       2,
       2},
      {"streaming waits like diloco",
       SyncMode::kStreaming,
       1,
       {{10, 5000}, {20, kNever}},
       {},
       A::kWait,
       R::kWaitingForAll,
       2980,
       2,
       2},
  };
  for (const Row& row : rows) {
    INFO(row.name);
    const Decision d =
        Decide(kNow, StateOf(row.learners, row.timings), OptionsOf(row.mode, row.quorum));
    INFO(d.detail());
    CHECK(ToString(d.reason) == std::string(ToString(row.reason)));
    CHECK(d.action == row.action);
    CHECK(d.quorum == row.expect_quorum);
    CHECK(d.live == row.expect_live);
    if (row.wait_ms == kForever) {
      CHECK(d.wait_until == SyncTime::max());
    } else {
      CHECK(std::chrono::floor<milliseconds>(d.wait_until - kNow).count() == row.wait_ms);
    }
    if (row.mode != SyncMode::kDecoupled) CHECK(d.grace_ms == 0);
  }
}

TEST_CASE("sync: Decide again at wait_until: the grace window closes the round", "[unit][sync]") {
  const RoundState state = StateOf({{10, 100}, {10, kNever}}, k750);
  const DecideOptions options = OptionsOf(SyncMode::kDecoupled, 1);
  const Decision waiting = Decide(kNow, state, options);
  REQUIRE(waiting.reason == DecideReason::kGraceRunning);
  CHECK(waiting.grace_ms == Approx(750));
  CHECK(Decide(waiting.wait_until - milliseconds(1), state, options).action == DecideAction::kWait);
  const Decision closed = Decide(waiting.wait_until, state, options);
  CHECK(closed.action == DecideAction::kMerge);
  CHECK(closed.reason == DecideReason::kGraceExpired);
  CHECK(closed.detail() == "1 contributed, 2 live, quorum 1, grace 750 ms, 0 due");
}

TEST_CASE("sync: the grace window is gamma (tau step - quorum - sync time) clamped to the cap",
          "[unit][sync]") {
  DecideOptions o = OptionsOf(SyncMode::kDecoupled, 1);
  auto window = [&](std::optional<double> step, double quorum, double sync) {
    return GraceWindowMs(StateOf({}, {step, quorum, sync}).timings, o);
  };
  CHECK(window(1000, 200, 300) == Approx(750));
  CHECK(window(10000, 200, 300) == 2000);  // capped
  CHECK(window(100, 500, 100) == 0);       // no slack
  CHECK(window(std::nullopt, 0, 0) == 2000);
  o.overlap_steps = 4;
  o.grace_gamma = 0.25;
  CHECK(window(1000, 200, 300) == Approx(0.25 * (4000 - 500)));
  o.grace_cap_ms = 0;
  CHECK(window(1000, 200, 300) == 0);
}

TEST_CASE("sync: the grace window takes its step time from the slowest live learner", "[unit][sync]") {
  DecideOptions o = OptionsOf(SyncMode::kDecoupled, 1);
  // The heartbeats' EMA says 1000 ms; learner 1 reports 3000 ms, learner 2 (dead) 9000 ms.
  RoundState state = StateOf({{10, 10}, {10, kNever}, {5000, kNever}}, {1000.0, 200.0, 300.0});
  state.learners[0].step_ms = 900;
  state.learners[1].step_ms = 3000;
  state.learners[2].step_ms = 9000;
  CHECK(GraceStepMs(kNow, state, o) == Approx(3000));
  // 0.5 · (2 · 3000 − 500) = 2750, capped at 2000; the cap in steps (1 × 3000) does not bind.
  Decision d = Decide(kNow, state, o);
  CHECK(d.grace_ms == Approx(2000));
  // The mean instead: the EMA's 1000 ms gives the 750 ms window.
  o.grace_slowest_step = false;
  CHECK(GraceStepMs(kNow, state, o) == Approx(1000));
  CHECK(Decide(kNow, state, o).grace_ms == Approx(750));
  // No learner has reported a step time: the EMA; nothing at all: no step time, the cap.
  o.grace_slowest_step = true;
  for (LearnerPresence& l : state.learners) l.step_ms = 0;
  CHECK(GraceStepMs(kNow, state, o) == Approx(1000));
  CHECK_FALSE(GraceStepMs(kNow, StateOf({{10, 10}}, {}), o).has_value());
}

TEST_CASE("sync: the grace cap in inner steps bounds the window and the forecast wait", "[unit][sync]") {
  DecideOptions o = OptionsOf(SyncMode::kDecoupled, 1);
  o.grace_cap_steps = 1;
  CHECK(GraceCapMs(1000.0, o) == Approx(1000));
  CHECK(GraceCapMs(5000.0, o) == Approx(2000));  // cap_ms still bounds it
  CHECK(GraceCapMs(std::nullopt, o) == Approx(2000));
  o.grace_cap_steps = 0.25;
  CHECK(GraceWindowMs(StateOf({}, k750).timings, o) == Approx(250));  // 750 capped at 0.25 × 1000
  // Learner 1's delta is due in 600 ms: within a 2000 ms cap it is waited for, not within
  // one step of 500 ms.
  o.grace_cap_steps = 0;
  const RoundState state = StateOf({{10, 0}, {10, kNever, 600}}, {500.0, 0.0, 0.0});
  Decision d = Decide(kNow, state, o);
  CHECK(d.reason == DecideReason::kAwaitingDue);
  CHECK(d.awaited == 1);
  o.grace_cap_steps = 1;
  d = Decide(kNow, state, o);
  CHECK(d.reason == DecideReason::kGraceRunning);  // 0.5 · (2 · 500) = 500 ms, not stretched
  CHECK(d.awaited == 0);
  // Without the forecast the due learner is not waited for either.
  o.grace_cap_steps = 0;
  o.grace_forecast = false;
  d = Decide(kNow, state, o);
  CHECK(d.reason == DecideReason::kGraceRunning);
  CHECK(d.awaited == 0);
  CHECK(d.grace_ms == Approx(500));
}

// Learners 0-2 step in 100 ms and learner 0's delta is in; learner 3 steps in slow_step_ms and
// its delta is due in due_in_ms.
RoundState FleetAndOne(int due_in_ms, double slow_step_ms) {
  RoundState state = StateOf({{10, 0}, {10, kNever}, {10, kNever}, {10, kNever, due_in_ms}}, {100.0, 0.0, 0.0});
  for (LearnerPresence& l : state.learners) l.step_ms = 100;
  state.learners[3].step_ms = slow_step_ms;
  return state;
}

TEST_CASE("sync: the grace cap counts the fleet's steps, not the straggler's", "[unit][sync]") {
  DecideOptions o = OptionsOf(SyncMode::kDecoupled, 1);
  o.grace_cap_ms = 20000;
  o.grace_cap_steps = 4;
  // Learner 3, slowed to 300 ms a step, is due in 1200 ms: 4 of its own steps, 12 of the fleet's.
  RoundState state = FleetAndOne(1200, 300);
  CHECK(FleetStepMs(kNow, state, o) == Approx(100));
  CHECK(GraceStepMs(kNow, state, o) == Approx(300));  // the window's ξ_step is still the slowest
  Decision d = Decide(kNow, state, o);
  CHECK(d.awaited == 0);  // due after 4 fleet steps: not waited for
  CHECK(d.grace_ms == Approx(300));  // 0.5 · (2 · 300), within the 400 ms cap
  // Due in 350 ms, within 4 fleet steps: waited for.
  state.learners[3].expected_at = kNow + std::chrono::milliseconds(350);
  d = Decide(kNow, state, o);
  CHECK(d.reason == DecideReason::kAwaitingDue);
  CHECK(d.awaited == 1);
  // The lower median of an even count; nothing reported: the heartbeats' EMA.
  state.learners[0].step_ms = 50;
  CHECK(FleetStepMs(kNow, state, o) == Approx(100));
  for (LearnerPresence& l : state.learners) l.step_ms = 0;
  CHECK(FleetStepMs(kNow, state, o) == Approx(100));
  CHECK_FALSE(FleetStepMs(kNow, StateOf({{10, 10}}, {}), o).has_value());
}

TEST_CASE("sync: the forecast does not wait for a straggler", "[unit][sync]") {
  DecideOptions o = OptionsOf(SyncMode::kDecoupled, 1);
  o.grace_cap_ms = 20000;
  o.grace_straggler_ratio = 2;
  RoundState state = FleetAndOne(900, 190);  // 1.9x the fleet's step: waited for
  Decision d = Decide(kNow, state, o);
  CHECK(d.reason == DecideReason::kAwaitingDue);
  CHECK(d.awaited == 1);
  state.learners[3].step_ms = 300;  // 3x: a straggler, the rounds do not go at its pace
  d = Decide(kNow, state, o);
  CHECK(d.awaited == 0);
  CHECK(d.reason == DecideReason::kGraceRunning);
  o.grace_straggler_ratio = 0;  // off: waited for
  d = Decide(kNow, state, o);
  CHECK(d.awaited == 1);
}

TEST_CASE("sync: Ema takes its first sample as is, then moves by its weight", "[unit][sync]") {
  Ema ema(0.2);
  CHECK_FALSE(ema.has_value());
  CHECK(ema.value() == 0);
  ema.Add(100);
  CHECK(ema.has_value());
  CHECK(ema.value() == 100);
  ema.Add(200);
  CHECK(ema.value() == Approx(120));
  ema.Add(120);
  CHECK(ema.value() == Approx(120));
}

TEST_CASE("sync: staleness: deltas too far behind or from the future are dropped", "[unit][sync]") {
  struct Case {
    uint64_t current, base;
    int max_staleness;
    StalenessVerdict verdict;
    uint64_t staleness;
  };
  const std::vector<Case> cases = {
      {10, 10, 4, StalenessVerdict::kFresh, 0},         {10, 6, 4, StalenessVerdict::kFresh, 4},
      {10, 5, 4, StalenessVerdict::kTooStale, 5},       {10, 0, 4, StalenessVerdict::kTooStale, 10},
      {10, 11, 4, StalenessVerdict::kFromTheFuture, 0}, {3, 3, 0, StalenessVerdict::kFresh, 0},
      {3, 2, 0, StalenessVerdict::kTooStale, 1},        {0, 0, 0, StalenessVerdict::kFresh, 0},
  };
  for (const Case& c : cases) {
    INFO("current " << c.current << " base " << c.base << " max " << c.max_staleness);
    const StalenessCheck check = CheckStaleness(c.current, c.base, c.max_staleness);
    CHECK(check.verdict == c.verdict);
    CHECK(check.staleness == c.staleness);
    CHECK(check.accepted() == (c.verdict == StalenessVerdict::kFresh));
  }
  CHECK(std::string(ToString(StalenessVerdict::kTooStale)) == "too_stale");
  CHECK(std::string(ToString(StalenessVerdict::kFromTheFuture)) == "from_the_future");
}

}  // namespace
TEST_CASE("CheckCounts: a delta's counts must fit the learner's steps and the run", "[unit]") {
  const CountLimits limits{.max_steps = 1000, .tokens_per_step = 512};  // e.g. 2 ranks x 4 x 64
  struct Row {
    uint64_t c_steps, c_tokens, learner_step;
    CountsVerdict want;
  };
  const Row rows[] = {
      {25, 25 * 512, 100, CountsVerdict::kPlausible},
      {25, 25 * 512 - 1, 100, CountsVerdict::kPlausible},  // fewer tokens: a short last batch is fine
      {100, 100 * 512, 100, CountsVerdict::kPlausible},    // every step since the start
      {1000, 1000 * 512, 1000, CountsVerdict::kPlausible}, // the final flush at train.steps
      {0, 0, 100, CountsVerdict::kNoSteps},
      {101, 101 * 512, 100, CountsVerdict::kMoreStepsThanLearner},
      {25, 25 * 512, 1001, CountsVerdict::kPastTheRun},
      {25, 25 * 512 + 1, 100, CountsVerdict::kTooManyTokens},
      {25, ~uint64_t{0}, 100, CountsVerdict::kTooManyTokens},  // 2^64 - 1 tokens: would outweigh everyone
      {~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}, CountsVerdict::kPastTheRun},
  };
  for (const Row& r : rows) {
    INFO("c_steps " << r.c_steps << ", c_tokens " << r.c_tokens << ", learner step " << r.learner_step);
    CHECK(CheckCounts(r.c_steps, r.c_tokens, r.learner_step, limits) == r.want);
  }
  // Without limits only the step relation is checked.
  CHECK(CheckCounts(5, ~uint64_t{0}, 10, {}) == CountsVerdict::kPlausible);
  CHECK(std::string(ToString(CountsVerdict::kTooManyTokens)) == "too_many_tokens");
}

}  // namespace diloco
