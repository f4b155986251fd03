// The syncer's round book as tables: which deltas it admits (and why not), what it drops and
// tells, what it hands to a merge, what it acks, and what it gives Decide, under a fake clock.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "daemon/sync/round_book.h"

namespace diloco {
namespace {

using std::chrono::milliseconds;

const SyncTime kStart = SyncTime() + std::chrono::hours(1);
SyncTime At(int64_t ms) { return kStart + milliseconds(ms); }
// ms since kStart, for readable failures.
int64_t Ms(SyncTime t) { return std::chrono::duration_cast<milliseconds>(t - kStart).count(); }

constexpr uint64_t kTokensPerStep = 512;
constexpr uint64_t kTwo63 = uint64_t{1} << 63;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const RoundTimings kNoTimings;

RoundBookOptions Options(int learners, int fragments) {
  RoundBookOptions o;
  o.learners = learners;
  o.fragments = fragments;
  o.inner_steps = 10;
  o.max_staleness = 4;
  o.heartbeat_timeout_ms = 3000;
  o.count_limits = {.max_steps = 1000, .tokens_per_step = kTokensPerStep};
  o.norm_limit = 10;
  return o;
}

// A plausible delta: 10 steps of full batches at learner step 100, norm per step 0.2.
DeltaArrival Delta(int learner, uint32_t fragment, uint64_t base, uint64_t c_steps = 10,
                   uint64_t learner_step = 100) {
  DeltaArrival d;
  d.learner = learner;
  d.fragment = fragment;
  d.base_version = base;
  d.c_steps = c_steps;
  d.c_tokens = c_steps * kTokensPerStep;
  d.learner_step = learner_step;
  d.held.values = {1, 1, 1, 1};
  return d;
}

FragmentCounters Counters(uint32_t fragment, uint64_t base, uint64_t c_steps, bool in_flight = false) {
  return {fragment, base, c_steps, c_steps * kTokensPerStep, in_flight};
}

HeartbeatMsg Beat(uint64_t step, float step_ms, std::vector<FragmentCounters> fragments = {},
                  LearnerState state = LearnerState::kTraining) {
  HeartbeatMsg hb;
  hb.state = state;
  hb.step = step;
  hb.step_time_ms = step_ms;
  hb.fragments = std::move(fragments);
  return hb;
}

HeartbeatMsg StateBeat(LearnerState state) { return Beat(100, 50, {}, state); }

TEST_CASE("round book: Admit checks counts, then staleness, then the norm filter", "[unit][sync][round_book]") {
  struct Row {
    std::string name;
    uint64_t base, c_steps, c_tokens, learner_step;
    std::vector<float> delta;
    std::string why;  // empty: accepted
    bool rejected;    // failed a check (vs. dropped)
  };
  const std::vector<float> kOk = {1, 1, 1, 1};  // norm 2 over 10 steps: 0.2 per step
  const uint64_t k10 = 10 * kTokensPerStep;
  // Current version 10, max staleness 4; the filter's median is 1 per step, limit 10 per step.
  const std::vector<Row> rows = {
      {"fresh", 10, 10, k10, 100, kOk, "", false},
      {"as stale as allowed", 6, 10, k10, 100, kOk, "", false},
      {"a short last batch", 10, 10, k10 - 1, 100, kOk, "", false},
      {"one version too stale", 5, 10, k10, 100, kOk, "too_stale", false},
      {"a base the syncer never published", 11, 10, k10, 100, kOk, "from_the_future", false},
      {"NaN", 10, 10, k10, 100, {1, kNaN, 1, 1}, "non_finite", true},
      {"Inf", 10, 10, k10, 100, {1, 1, INFINITY, 1}, "non_finite", true},
      // 400 / 10 steps = 40 per step > 10 x median 1.
      {"norm 40x the median", 10, 10, k10, 100, {200, 200, 200, 200}, "norm_too_large", true},
      // The same norm over 40 steps is 10 per step: at the limit, not above it.
      {"a big norm over many steps", 10, 40, 40 * kTokensPerStep, 100, {200, 200, 200, 200}, "", false},
      {"no steps", 10, 0, 0, 100, kOk, "implausible_counts", true},
      {"c_steps 2^63", 10, kTwo63, k10, 100, kOk, "implausible_counts", true},
      {"c_steps 2^63 at step 2^63", 10, kTwo63, k10, kTwo63, kOk, "implausible_counts", true},
      {"more steps than the learner made", 10, 101, 101 * kTokensPerStep, 100, kOk, "implausible_counts", true},
      {"past the run", 10, 10, k10, 1001, kOk, "implausible_counts", true},
      {"one token more than c_steps x tokens_per_step", 10, 10, k10 + 1, 100, kOk, "implausible_counts", true},
      {"2^64-1 tokens", 10, 10, ~uint64_t{0}, 100, kOk, "implausible_counts", true},
      // Order of the checks: the first failing one names the drop.
      {"bad counts and too stale: counts first", 3, 0, 0, 100, kOk, "implausible_counts", true},
      {"too stale and NaN: staleness first", 3, 10, k10, 100, {kNaN, 0, 0, 0}, "too_stale", false},
      {"from the future and huge: staleness first", 12, 10, k10, 100, {1e6, 0, 0, 0}, "from_the_future", false},
  };
  for (const Row& row : rows) {
    INFO(row.name);
    RoundBook book(Options(3, 2), kStart);
    // Three 10-step deltas of norm 10 give fragment 1's filter a median of 1 per step.
    for (uint64_t base : {7, 8, 9}) {
      DeltaArrival warm = Delta(0, 1, base);
      warm.held.values = {10, 0, 0, 0};
      REQUIRE(book.Admit(std::move(warm), 10, At(0)));
    }
    (void)book.TakeForMerge(1, 10);
    REQUIRE(book.TakeDrops().size() == 2);  // the two replaced warm-ups

    DeltaArrival d = Delta(2, 1, row.base);
    d.c_steps = row.c_steps;
    d.c_tokens = row.c_tokens;
    d.learner_step = row.learner_step;
    d.held.values = row.delta;
    const bool accepted = book.Admit(std::move(d), 10, At(5));
    const std::vector<DeltaDrop> drops = book.TakeDrops();
    if (row.why.empty()) {
      CHECK(accepted);
      CHECK(book.PendingCount(1) == 1);
      CHECK(drops.empty());
      continue;
    }
    CHECK_FALSE(accepted);
    CHECK(book.PendingCount(1) == 0);
    CHECK(book.PendingCount(0) == 0);
    REQUIRE(drops.size() == 1);
    CHECK(drops[0].why == row.why);
    CHECK(drops[0].learner == 2);
    CHECK(drops[0].fragment == 1);
    CHECK(drops[0].base_version == row.base);
    CHECK(drops[0].rejected == row.rejected);
    CHECK(drops[0].tell_learner);  // every refused delta is named: the learner sends again
    CHECK_FALSE(drops[0].detail.empty());
  }
}

TEST_CASE("round book: the implausible_counts detail names the CheckCounts verdict", "[unit][sync][round_book]") {
  RoundBook book(Options(1, 1), kStart);
  CHECK_FALSE(book.Admit(Delta(0, 0, 0, /*c_steps=*/101, /*learner_step=*/100), 0, At(0)));
  const std::vector<DeltaDrop> drops = book.TakeDrops();
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].detail.rfind("more_steps_than_learner: c_steps 101", 0) == 0);
}

TEST_CASE("round book: a delta's c_steps is capped by its last heartbeat for the same base",
          "[unit][sync][round_book]") {
  struct Row {
    std::string name;
    uint32_t fragment;
    uint64_t base, learner_step, c_steps;
    bool accepted;
  };
  // The heartbeat at step 100: fragment 0 base 7 with c_steps 20 (fragment 1 not in it).
  // Allowed at step s: 20 + (s - 100) + 1 (one step of rounding slack).
  const std::vector<Row> rows = {
      {"claims 40 steps five steps later", 0, 7, 105, 40, false},
      {"claims the 25 it made", 0, 7, 105, 25, true},
      {"one step of slack", 0, 7, 105, 26, true},
      {"two steps over", 0, 7, 105, 27, false},
      {"at the heartbeat's own step", 0, 7, 100, 21, true},
      {"at the heartbeat's own step, over", 0, 7, 100, 22, false},
      {"a delta from before the beat", 0, 7, 98, 19, true},
      {"a delta from before the beat, over", 0, 7, 98, 20, false},
      {"another base is not cross-checked", 0, 6, 105, 40, true},
  };
  for (const Row& row : rows) {
    INFO(row.name);
    RoundBook book(Options(1, 2), kStart);
    book.OnHeard(0, 1, At(0));
    book.OnHeartbeat(0, Beat(100, 50, {Counters(0, 7, 20)}), At(0));
    const bool accepted = book.Admit(Delta(0, row.fragment, row.base, row.c_steps, row.learner_step), 7, At(10));
    CHECK(accepted == row.accepted);
    const std::vector<DeltaDrop> drops = book.TakeDrops();
    if (row.accepted) {
      CHECK(drops.empty());
    } else {
      REQUIRE(drops.size() == 1);
      CHECK(drops[0].why == "implausible_counts");
      CHECK(drops[0].rejected);
      CHECK(drops[0].detail.rfind("more steps than its heartbeats show", 0) == 0);
    }
  }

  SECTION("a fragment the beat did not list is not cross-checked") {
    RoundBook book(Options(1, 2), kStart);
    book.OnHeard(0, 1, At(0));
    book.OnHeartbeat(0, Beat(100, 50, {Counters(0, 7, 20)}), At(0));
    // Fragment 1 still at base 0: the beat says nothing of it, not "base 0, 0 steps".
    CHECK(book.Admit(Delta(0, 1, 0, 40, 105), 0, At(10)));
  }
  SECTION("an older beat arriving late (from before the fold to base 7) is ignored") {
    RoundBook book(Options(1, 1), kStart);
    book.OnHeard(0, 1, At(0));
    book.OnHeartbeat(0, Beat(100, 50, {Counters(0, 7, 20)}), At(0));
    book.OnHeartbeat(0, Beat(90, 50, {Counters(0, 6, 10)}), At(5));  // step 90 < 100
    // Had it replaced the newer beat, base 7 would no longer be cross-checked.
    CHECK_FALSE(book.Admit(Delta(0, 0, 7, 40, 105), 7, At(10)));
    CHECK(book.Admit(Delta(0, 0, 7, 26, 105), 7, At(10)));
  }
  SECTION("a listed fragment at 0 steps (just folded) is cross-checked") {
    RoundBook book(Options(1, 1), kStart);
    book.OnHeard(0, 1, At(0));
    book.OnHeartbeat(0, Beat(100, 50, {Counters(0, 7, 0)}), At(0));
    CHECK_FALSE(book.Admit(Delta(0, 0, 7, 100, 101), 7, At(10)));  // allowed: 0 + 1 + 1
    CHECK(book.Admit(Delta(0, 0, 7, 2, 101), 7, At(10)));
  }
  SECTION("counts near 2^64 do not overflow the cross-check") {
    RoundBookOptions o = Options(1, 1);
    o.count_limits = {};  // only the heartbeat cross-check stands in the way
    RoundBook book(o, kStart);
    book.OnHeard(0, 1, At(0));
    book.OnHeartbeat(0, Beat(100, 50, {Counters(0, 7, 20)}), At(0));
    DeltaArrival d = Delta(0, 0, 7, kTwo63, kTwo63);
    d.c_tokens = 0;
    CHECK_FALSE(book.Admit(std::move(d), 7, At(10)));
  }
  SECTION("a new incarnation forgets the old one's heartbeat") {
    RoundBook book(Options(1, 1), kStart);
    book.OnHeard(0, 1, At(0));
    book.OnHeartbeat(0, Beat(100, 50, {Counters(0, 7, 20)}), At(0));
    book.OnHeard(0, 2, At(5));
    CHECK(book.Admit(Delta(0, 0, 7, 40, 105), 7, At(10)));
  }
}

TEST_CASE("round book: a newer delta of the same learner replaces the older one", "[unit][sync][round_book]") {
  RoundBook book(Options(3, 2), kStart);
  REQUIRE(book.Admit(Delta(0, 1, 8), 9, At(10)));
  REQUIRE(book.Admit(Delta(1, 1, 8), 9, At(20)));
  REQUIRE(book.Admit(Delta(2, 0, 8), 9, At(25)));  // another fragment
  DeltaArrival newer = Delta(0, 1, 9, 12);
  newer.held.values = {2, 2, 2, 2};
  CHECK(book.Admit(std::move(newer), 9, At(30)));
  CHECK(book.PendingCount(1) == 2);
  CHECK(book.PendingCount(0) == 1);

  const std::vector<DeltaDrop> drops = book.TakeDrops();
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].why == "replaced");
  CHECK(drops[0].learner == 0);
  CHECK(drops[0].fragment == 1);
  CHECK(drops[0].base_version == 8);  // the older one's base
  CHECK_FALSE(drops[0].rejected);
  CHECK_FALSE(drops[0].tell_learner);  // its newer delta is pending: nothing to resend
  CHECK(book.TakeDrops().empty());     // TakeDrops empties

  // A refused newer delta replaces nothing: the older one stays pending.
  DeltaArrival bad = Delta(1, 1, 9);
  bad.held.values = {kNaN, 0, 0, 0};
  CHECK_FALSE(book.Admit(std::move(bad), 9, At(40)));
  CHECK(book.TakeDrops().size() == 1);

  const std::vector<PendingDelta> merged = book.TakeForMerge(1, 9);
  REQUIRE(merged.size() == 2);
  CHECK(merged[0].learner == 0);
  CHECK(merged[0].base_version == 9);
  CHECK(merged[0].counts.steps == 12);
  CHECK(merged[0].counts.tokens == 12 * kTokensPerStep);
  CHECK(merged[0].held.values == std::vector<float>{2, 2, 2, 2});
  CHECK(Ms(merged[0].at) == 30);
  CHECK(merged[1].learner == 1);  // untouched by learner 0's replacement and its own bad delta
  CHECK(merged[1].base_version == 8);
  CHECK(Ms(merged[1].at) == 20);
  CHECK(book.PendingCount(0) == 1);  // other fragments' rounds stay open
}

TEST_CASE("round book: Reject records a told, rejected drop", "[unit][sync][round_book]") {
  RoundBook book(Options(2, 3), kStart);
  book.Reject(1, 2, 17, "bad_payload", "4 bytes short");
  CHECK_FALSE(book.HasPending(2));
  std::vector<DeltaDrop> drops = book.TakeDrops();
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].learner == 1);
  CHECK(drops[0].fragment == 2);
  CHECK(drops[0].base_version == 17);
  CHECK(drops[0].why == "bad_payload");
  CHECK(drops[0].detail == "4 bytes short");
  CHECK(drops[0].rejected);
  CHECK(drops[0].tell_learner);
  CHECK(book.TakeDrops().empty());
}

TEST_CASE("round book: TakeForMerge hands over fresh deltas in learner order and drops the stale",
          "[unit][sync][round_book]") {
  RoundBook book(Options(4, 1), kStart);
  // Arrival order 3, 0, 2, 1; all fresh at version 9 (max staleness 4).
  REQUIRE(book.Admit(Delta(3, 0, 9), 9, At(1)));
  REQUIRE(book.Admit(Delta(0, 0, 6), 9, At(2)));
  REQUIRE(book.Admit(Delta(2, 0, 5), 9, At(3)));
  REQUIRE(book.Admit(Delta(1, 0, 8), 9, At(4)));
  REQUIRE(book.TakeDrops().empty());

  // The fragment moved on to 10: learner 2's base 5 is now 5 versions behind.
  const std::vector<PendingDelta> merged = book.TakeForMerge(0, 10);
  REQUIRE(merged.size() == 3);
  CHECK(merged[0].learner == 0);
  CHECK(merged[1].learner == 1);
  CHECK(merged[2].learner == 3);
  CHECK(merged[0].base_version == 6);
  CHECK(merged[1].base_version == 8);
  CHECK(merged[2].base_version == 9);

  const std::vector<DeltaDrop> drops = book.TakeDrops();
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].why == "too_stale");
  CHECK(drops[0].learner == 2);
  CHECK(drops[0].fragment == 0);
  CHECK(drops[0].base_version == 5);
  CHECK_FALSE(drops[0].rejected);
  CHECK(drops[0].tell_learner);

  // The round is empty after.
  CHECK_FALSE(book.HasPending(0));
  CHECK(book.TakeForMerge(0, 10).empty());
  CHECK(book.TakeDrops().empty());
}

TEST_CASE("round book: a new incarnation forgets the old one, the same one does not",
          "[unit][sync][round_book]") {
  RoundBook book(Options(1, 2), kStart);
  CHECK(book.OnHeard(0, 5, At(10)));  // first heard: new
  CHECK_FALSE(book.OnHeard(0, 5, At(20)));
  book.OnStreamSeq(0, 7);
  book.OnHeartbeat(0, Beat(100, 50, {Counters(1, 3, 4)}, LearnerState::kFinished), At(20));
  REQUIRE(book.Finished(0));
  REQUIRE(book.AllDone());
  REQUIRE(book.ExpectedDeltaAt(0, 1).has_value());

  CHECK_FALSE(book.OnHeard(0, 5, At(30)));  // the same incarnation: all kept
  CHECK(book.Finished(0));
  CHECK(book.AllDone());
  CHECK(book.Acks().at(0).heard_seq == 7);
  CHECK(book.ExpectedDeltaAt(0, 1).has_value());

  CHECK(book.OnHeard(0, 6, At(40)));  // a restart
  CHECK_FALSE(book.Finished(0));
  CHECK_FALSE(book.AllDone());
  CHECK(book.Live(0, At(40)));
  const std::vector<LearnerAck> acks = book.Acks();
  REQUIRE(acks.size() == 1);
  CHECK(acks[0].incarnation == 6);
  CHECK(acks[0].heard_seq == 0);
  CHECK_FALSE(book.ExpectedDeltaAt(0, 1).has_value());  // its beat is gone
  CHECK(Ms(book.Round(1, At(50), kNoTimings).learners.at(0).last_heard) == 40);
}

TEST_CASE("round book: a learner's step is merged once per fragment, across its restarts",
          "[unit][sync][round_book]") {
  // dilococtl dst --seed 8359: a learner restarted into a lock-step fleet redid a step whose
  // delta its earlier incarnation had sent and the syncer had merged.
  RoundBook book(Options(2, 2), kStart);
  book.OnHeard(0, 5, At(0));
  REQUIRE(book.Admit(Delta(0, 0, 4, 1, 25), 4, At(10)));
  REQUIRE(book.TakeForMerge(0, 4).size() == 1);

  CHECK(book.OnHeard(0, 6, At(20)));  // a restart
  CHECK_FALSE(book.Admit(Delta(0, 0, 4, 1, 25), 5, At(30)));
  std::vector<DeltaDrop> drops = book.TakeDrops();
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].why == "already_merged");
  CHECK(drops[0].detail == "sent at step 25, its delta of step 25 is merged");
  CHECK(drops[0].tell_learner);  // so it counts those steps as merged
  CHECK_FALSE(drops[0].rejected);
  CHECK(DropKeepsWork(drops[0].why));

  // A later step, another fragment and another learner's same step are new work.
  CHECK(book.Admit(Delta(0, 1, 4, 1, 25), 5, At(40)));
  CHECK(book.Admit(Delta(1, 0, 4, 1, 25), 5, At(40)));
  CHECK(book.Admit(Delta(0, 0, 4, 13, 26), 5, At(40)));  // dilococtl dst --seed 2083
  CHECK(book.TakeDrops().empty());
}

TEST_CASE("round book: merges recalled on resume restore the merged steps and the cadence",
          "[unit][sync][round_book]") {
  // dilococtl dst --seed 26: a restarted syncer forgot both, and a learner rejoining its lock-step
  // fleet started at step 4 and had 42 steps merged again.
  RoundBook book(Options(2, 2), kStart);
  CHECK(book.CadenceStep() == 0);
  book.RecallMerged(0, 0, 20);
  book.RecallMerged(1, 1, 15);
  book.RecallMerged(7, 0, 99);  // no such learner: ignored
  CHECK(book.CadenceStep() > 0);
  CHECK_FALSE(book.Admit(Delta(0, 0, 4, 10, 20), 4, At(10)));
  CHECK(book.TakeDrops().at(0).why == "already_merged");
  CHECK(book.Admit(Delta(1, 0, 4, 10, 20), 4, At(10)));  // learner 1's fragment 0: not merged
}

TEST_CASE("round book: acks list heard learners, their highest seq and their pending deltas",
          "[unit][sync][round_book]") {
  RoundBook book(Options(3, 3), kStart);
  CHECK(book.Acks().empty());  // nobody heard yet
  book.OnHeard(0, 11, At(0));
  book.OnHeard(2, 33, At(0));
  book.OnStreamSeq(0, 5);
  book.OnStreamSeq(0, 9);
  book.OnStreamSeq(0, 3);  // late, lower: the max stays
  book.OnStreamSeq(2, 1);
  REQUIRE(book.Admit(Delta(0, 2, 3), 4, At(1)));
  REQUIRE(book.Admit(Delta(0, 0, 4), 4, At(2)));
  REQUIRE(book.Admit(Delta(1, 1, 4), 4, At(3)));  // learner 1 is not heard: no ack

  const std::vector<LearnerAck> acks = book.Acks();
  REQUIRE(acks.size() == 2);
  CHECK(acks[0].learner == "learner-0");
  CHECK(acks[0].incarnation == 11);
  CHECK(acks[0].heard_seq == 9);
  CHECK(acks[0].pending_fragments == std::vector<uint32_t>{0, 2});  // fragment order
  CHECK(acks[0].pending_bases == std::vector<uint64_t>{4, 3});
  CHECK(acks[1].learner == "learner-2");
  CHECK(acks[1].incarnation == 33);
  CHECK(acks[1].heard_seq == 1);
  CHECK(acks[1].pending_fragments.empty());
  CHECK(acks[1].pending_bases.empty());

  (void)book.TakeForMerge(0, 4);  // merged: no longer pending
  CHECK(book.Acks()[0].pending_fragments == std::vector<uint32_t>{2});
  CHECK(book.Acks()[0].pending_bases == std::vector<uint64_t>{3});
}

TEST_CASE("round book: Live: heard within the timeout and not finished, stopping or failed",
          "[unit][sync][round_book]") {
  struct Row {
    std::string name;
    bool heard;
    std::optional<LearnerState> state;  // its last heartbeat's
    int64_t now_ms;                     // heard at 1000
    bool live;
  };
  const std::vector<Row> rows = {
      {"never heard", false, std::nullopt, 1000, false},
      {"just heard", true, std::nullopt, 1000, true},
      {"heard exactly at the timeout", true, std::nullopt, 4000, true},
      {"one ms past the timeout", true, std::nullopt, 4001, false},
      {"training", true, LearnerState::kTraining, 2000, true},
      {"resyncing", true, LearnerState::kResyncing, 2000, true},
      {"joining", true, LearnerState::kJoining, 2000, true},
      {"stopping", true, LearnerState::kStopping, 2000, false},
      {"finished", true, LearnerState::kFinished, 2000, false},
      {"failed", true, LearnerState::kFailed, 2000, false},
  };
  for (const Row& row : rows) {
    INFO(row.name);
    RoundBook book(Options(1, 1), kStart);
    if (row.heard) book.OnHeard(0, 1, At(1000));
    if (row.state) book.OnHeartbeat(0, StateBeat(*row.state), At(1000));
    CHECK(book.Live(0, At(row.now_ms)) == row.live);
    CHECK(book.Heard(0) == row.heard);
    const bool finished = row.state == LearnerState::kStopping || row.state == LearnerState::kFinished ||
                          row.state == LearnerState::kFailed;
    CHECK(book.Finished(0) == finished);
    CHECK(book.AllDone() == (row.state == LearnerState::kFinished));
  }
}

TEST_CASE("round book: AllDone only when every learner said kFinished; a delta revives a stopping one",
          "[unit][sync][round_book]") {
  RoundBook book(Options(2, 1), kStart);
  book.OnHeard(0, 1, At(0));
  book.OnHeard(1, 1, At(0));
  book.OnHeartbeat(0, StateBeat(LearnerState::kFinished), At(10));
  CHECK_FALSE(book.AllDone());
  book.OnHeartbeat(1, StateBeat(LearnerState::kStopping), At(10));
  CHECK_FALSE(book.AllDone());  // stopping is not finished
  CHECK_FALSE(book.Live(1, At(10)));

  // Learner 1 flushes its last delta after kStopping: waited for again.
  book.OnDeltaSeen(1, 0);
  CHECK_FALSE(book.Finished(1));
  CHECK(book.Live(1, At(10)));
  const RoundState round = book.Round(0, At(10), kNoTimings);
  REQUIRE(round.learners.size() == 1);  // learner 0 finished with nothing pending: not waited for
  CHECK(round.learners[0].learner == 1);

  book.OnHeartbeat(1, StateBeat(LearnerState::kFailed), At(20));
  CHECK_FALSE(book.AllDone());  // failed is not finished either
  book.OnHeartbeat(1, StateBeat(LearnerState::kFinished), At(30));
  CHECK(book.AllDone());
  book.OnDeltaSeen(0, 0);  // a finished learner that sends again is not done
  CHECK_FALSE(book.AllDone());
}

struct Presence {
  int learner;
  int64_t last_heard_ms;
  std::optional<int64_t> contributed_ms, expected_ms;
};

void CheckRound(const RoundState& rs, const std::vector<Presence>& want) {
  REQUIRE(rs.learners.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const LearnerPresence& got = rs.learners[i];
    INFO("learner " << want[i].learner);
    CHECK(got.learner == want[i].learner);
    CHECK(Ms(got.last_heard) == want[i].last_heard_ms);
    CHECK(got.contributed_at.has_value() == want[i].contributed_ms.has_value());
    if (got.contributed_at && want[i].contributed_ms) CHECK(Ms(*got.contributed_at) == *want[i].contributed_ms);
    CHECK(got.expected_at.has_value() == want[i].expected_ms.has_value());
    if (got.expected_at && want[i].expected_ms) CHECK(Ms(*got.expected_at) == *want[i].expected_ms);
  }
}

// The liveness thread's copy of a kTraining beat can arrive after the training thread's kFinished
// beat of the same step: it must not make the learner one to wait for again.
TEST_CASE("round book: a late beat of the same step does not undo kFinished", "[unit][sync][round_book]") {
  RoundBook book(Options(1, 1), kStart);
  book.OnHeard(0, 1, At(0));
  book.OnHeartbeat(0, Beat(100, 50, {}, LearnerState::kFinished), At(0));
  book.OnHeartbeat(0, Beat(100, 50, {}, LearnerState::kTraining), At(5));
  CHECK(book.Finished(0));
  CHECK(book.AllDone());
  // A later step is news, though (a learner that said kStopping may go on).
  book.OnHeartbeat(0, Beat(101, 50, {}, LearnerState::kTraining), At(10));
  CHECK_FALSE(book.Finished(0));
}

TEST_CASE("round book: Round: who is waited for, when heard, when in, when due", "[unit][sync][round_book]") {
  // H = 10, P = 2: fragment 0 fires at steps ≡ 0 (mod 10), fragment 1 at steps ≡ 5.
  RoundBook book(Options(5, 2), kStart);
  // 0: training, beat at step 100 (50 ms a step) heard at 100 ms: fragment 0 fires at step 110,
  //    10 steps + 1 of slack = 550 ms after the beat.
  book.OnHeard(0, 1, At(100));
  book.OnHeartbeat(0, Beat(100, 50), At(100));
  // 1: finished, nothing pending: not waited for.
  book.OnHeard(1, 1, At(200));
  book.OnHeartbeat(1, StateBeat(LearnerState::kFinished), At(200));
  // 2: finished with its last delta pending: in, and counts as heard now.
  book.OnHeard(2, 1, At(300));
  book.OnDeltaSeen(2, 0);
  REQUIRE(book.Admit(Delta(2, 0, 4), 4, At(300)));
  book.OnHeartbeat(2, StateBeat(LearnerState::kFinished), At(310));
  // 3: never heard: counts as heard at the book's start.
  // 4: training, its delta pending: in, no forecast.
  book.OnHeard(4, 1, At(400));
  book.OnHeartbeat(4, Beat(100, 50), At(400));
  REQUIRE(book.Admit(Delta(4, 0, 4), 4, At(450)));

  CheckRound(book.Round(0, At(5000), kNoTimings), {
                                              {0, 100, std::nullopt, 650},
                                              {2, 5000, 300, std::nullopt},
                                              {3, 0, std::nullopt, std::nullopt},
                                              {4, 400, 450, std::nullopt},
                                          });
  // Fragment 1 (fires at step 105: 5 + 1 steps): nobody is in; learner 4 now has a forecast and
  // learner 2 (finished, nothing pending there) is not waited for.
  CheckRound(book.Round(1, At(5000), kNoTimings), {
                                              {0, 100, std::nullopt, 400},
                                              {3, 0, std::nullopt, std::nullopt},
                                              {4, 400, std::nullopt, 700},
                                          });
  // Round carries the syncer's timings through to Decide.
  RoundTimings timings;
  timings.step_ms.Add(42);
  CHECK(book.Round(0, At(5000), timings).timings.step_ms.value() == 42);
}

TEST_CASE("round book: the forecast follows the newest heartbeat and stops while a delta is in flight",
          "[unit][sync][round_book]") {
  RoundBook book(Options(1, 2), kStart);
  auto due = [&](uint32_t p) -> std::optional<int64_t> {
    const std::optional<SyncTime> t = book.ExpectedDeltaAt(0, p);
    return t ? std::optional<int64_t>(Ms(*t)) : std::nullopt;
  };
  CHECK_FALSE(due(0));  // no heartbeat: unknown
  book.OnHeard(0, 1, At(0));
  CHECK_FALSE(due(0));
  book.OnHeartbeat(0, Beat(100, 0), At(100));
  CHECK_FALSE(due(0));  // no step time yet: unknown

  // Step 100 at 100 ms, 50 ms a step: fragment 0 in 10 + 1 steps, fragment 1 in 5 + 1.
  book.OnHeartbeat(0, Beat(100, 50), At(100));
  CHECK(due(0) == 650);
  CHECK(due(1) == 400);

  // An older beat (the liveness stream overtook the training thread's) moves nothing back.
  book.OnHeartbeat(0, Beat(95, 50), At(200));
  CHECK(due(0) == 650);
  CHECK(due(1) == 400);

  // Step 103 at 300 ms, 40 ms a step: fragment 0 in 7 + 1 steps, fragment 1 in 2 + 1.
  book.OnHeartbeat(0, Beat(103, 40), At(300));
  CHECK(due(0) == 620);
  CHECK(due(1) == 420);

  // Fragment 1's delta left: no forecast for it until a beat says it is no longer in flight.
  book.OnDeltaSeen(0, 1);
  CHECK_FALSE(due(1));
  CHECK(due(0) == 620);
  book.OnHeartbeat(0, Beat(106, 40, {Counters(1, 3, 1, /*in_flight=*/true)}), At(420));
  CHECK_FALSE(due(1));
  CHECK(due(0) == 420 + (4 + 1) * 40);
  book.OnHeartbeat(0, Beat(107, 40, {Counters(1, 4, 2, /*in_flight=*/false)}), At(460));
  CHECK(due(1) == 460 + (8 + 1) * 40);  // fires next at step 115

  // The run ends at step 110: at its last step a learner sends every fragment's work, so a
  // fragment firing later is due then.
  RoundBookOptions o = Options(1, 2);
  o.count_limits.max_steps = 110;
  RoundBook end(o, kStart);
  end.OnHeard(0, 1, At(0));
  end.OnHeartbeat(0, Beat(107, 40), At(460));
  const std::optional<SyncTime> last = end.ExpectedDeltaAt(0, 0);  // fires next at 110: the same
  REQUIRE(last);
  CHECK(Ms(*last) == 460 + (3 + 1) * 40);
  const std::optional<SyncTime> early = end.ExpectedDeltaAt(0, 1);  // fires next at 115: due at 110
  REQUIRE(early);
  CHECK(Ms(*early) == 460 + (3 + 1) * 40);
}

}  // namespace
}  // namespace diloco

namespace diloco {

// Found by `dilococtl dst --seed 40` (streaming, M=4, a learner killed before its first delta and
// restarted 3.6 s later): the restarted learner resumed at its own old step, out of step with
// the round already open, and the lock-step rounds waited on each other forever.
TEST_CASE("round book: a round does not wait for a learner restarted after it opened", "[unit][sync][round_book]") {
  RoundBook book(Options(3, 2), kStart);
  for (int l = 0; l < 3; l++) book.OnHeard(l, 100 + l, At(0));
  REQUIRE(book.Admit(Delta(0, 0, 0), 0, At(100)));
  // Learner 2 restarts (a new incarnation) after the round of fragment 0 opened.
  CHECK(book.OnHeard(2, 999, At(200)));
  const RoundState rs = book.Round(0, At(300), kNoTimings);
  std::vector<int> waited;
  for (const LearnerPresence& lp : rs.learners) waited.push_back(lp.learner);
  CHECK(waited == std::vector<int>{0, 1});
  // A round that opens after the restart waits for it as for everyone.
  REQUIRE(book.Admit(Delta(1, 1, 0), 0, At(400)));
  const RoundState next = book.Round(1, At(500), kNoTimings);
  CHECK(next.learners.size() == 3);
}

TEST_CASE("round book: the cadence step is the step before the earliest round not merged",
          "[unit][sync][round_book]") {
  RoundBook book(Options(3, 2), kStart);  // H = 10, P = 2: fragment 0 fires at 10, 20..; 1 at 5, 15..
  CHECK(book.CadenceStep() == 0);
  REQUIRE(book.Admit(Delta(0, 1, 0, 5, 5), 0, At(1)));
  CHECK(book.CadenceStep() == 0);  // admitted, not merged: a snapshot still holds the old version
  REQUIRE(book.TakeForMerge(1, 0).size() == 1);
  CHECK(book.CadenceStep() == 9);  // fragment 0's round of step 10 is the earliest still to merge
  REQUIRE(book.Admit(Delta(0, 0, 0, 10, 10), 0, At(2)));
  REQUIRE(book.TakeForMerge(0, 0).size() == 1);
  CHECK(book.CadenceStep() == 14);
  // Rounds merge out of step order: fragment 1's round of step 15 merges while fragment 0's of
  // step 20 is open, then fragment 1's of 25: the fleet still stands before step 20.
  REQUIRE(book.Admit(Delta(0, 1, 1, 10, 15), 1, At(3)));
  REQUIRE(book.TakeForMerge(1, 1).size() == 1);
  REQUIRE(book.Admit(Delta(0, 1, 2, 10, 25), 2, At(4)));
  REQUIRE(book.TakeForMerge(1, 2).size() == 1);
  CHECK(book.CadenceStep() == 19);
  // A flush delta (not at a firing step) counts at its fragment's last firing.
  REQUIRE(book.Admit(Delta(1, 0, 1, 3, 23), 1, At(5)));
  REQUIRE(book.TakeForMerge(0, 1).size() == 1);
  CHECK(book.CadenceStep() == 29);
}

TEST_CASE("round book: lock-step: a cadence delta whose round merged without it is late and told",
          "[unit][sync][round_book]") {
  RoundBookOptions o = Options(3, 2);
  o.lock_step = true;
  RoundBook book(o, kStart);
  REQUIRE(book.Admit(Delta(0, 0, 0, 10, 20), 0, At(1)));
  REQUIRE(book.Admit(Delta(1, 0, 0, 10, 20), 0, At(2)));
  REQUIRE(book.TakeForMerge(0, 0).size() == 2);  // the round of step 20
  // Learner 2 (rejoined) fires fragment 0 at step 20 too, after that round merged.
  CHECK_FALSE(book.Admit(Delta(2, 0, 0, 10, 20), 1, At(3)));
  const std::vector<DeltaDrop> drops = book.TakeDrops();
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].why == "late");
  CHECK(drops[0].learner == 2);
  CHECK(drops[0].tell_learner);
  CHECK_FALSE(drops[0].rejected);
  CHECK(DropKeepsWork(drops[0].why));
  // The next round's deltas, and a flush delta of the merged step's fragment, are not late.
  CHECK(book.Admit(Delta(2, 0, 1, 10, 30), 1, At(4)));
  CHECK(book.Admit(Delta(0, 0, 1, 5, 25), 1, At(5)));
  CHECK(book.TakeDrops().empty());
  // Sent at the run's last step, a late delta goes to the next round: its learner trains no more
  // and its flush would only send it again.
  RoundBookOptions last = o;
  last.count_limits.max_steps = 20;
  RoundBook end(last, kStart);
  REQUIRE(end.Admit(Delta(0, 0, 0, 10, 20), 0, At(1)));
  REQUIRE(end.TakeForMerge(0, 0).size() == 1);
  CHECK(end.Admit(Delta(2, 0, 0, 10, 20), 1, At(3)));
  CHECK(end.TakeDrops().empty());
  // Not lock-step (decoupled): a delta behind the merged step is merged in the next round.
  RoundBook free(Options(3, 2), kStart);
  REQUIRE(free.Admit(Delta(0, 0, 0, 10, 20), 0, At(1)));
  REQUIRE(free.TakeForMerge(0, 0).size() == 1);
  CHECK(free.Admit(Delta(2, 0, 0, 10, 20), 1, At(3)));
}

TEST_CASE("round book: before it trains, a learner's heartbeat step may go back", "[unit][sync][round_book]") {
  RoundBook book(Options(1, 1), kStart);
  // Joining at its checkpoint's step 40, it starts at the lock-step fleet's step 30.
  book.OnHeartbeat(0, Beat(40, 50, {}, LearnerState::kJoining), At(1));
  book.OnHeartbeat(0, Beat(40, 50, {}, LearnerState::kResyncing), At(2));
  book.OnHeartbeat(0, Beat(30, 50), At(3));
  CHECK(book.LastStep(0) == 30);
  // Once training, an older beat (overtaken by a newer one) is ignored.
  book.OnHeartbeat(0, Beat(35, 50), At(4));
  book.OnHeartbeat(0, Beat(33, 50), At(5));
  CHECK(book.LastStep(0) == 35);
}

TEST_CASE("round book: lock-step: a learner past the round's step with nothing in flight is not waited for",
          "[unit][sync][round_book]") {
  RoundBookOptions o = Options(2, 2);  // H = 10, P = 2: fragment 0 fires at 10, 20..
  o.lock_step = true;
  RoundBook book(o, kStart);
  book.OnHeard(0, 1, At(0));
  book.OnHeard(1, 1, At(0));
  REQUIRE(book.Admit(Delta(0, 0, 0, 10, 10), 0, At(1)));
  // Learner 1 at step 10, its delta not sent yet: waited for.
  book.OnHeartbeat(1, Beat(10, 50, {Counters(0, 0, 10)}), At(2));
  RoundState rs = book.Round(0, At(3), kNoTimings);
  CHECK(rs.learners.size() == 2);
  // At step 12 with its delta of step 10 in flight: waited for.
  book.OnHeartbeat(1, Beat(12, 50, {Counters(0, 0, 12, true)}), At(4));
  CHECK(book.Round(0, At(5), kNoTimings).learners.size() == 2);
  // At step 13 with nothing in flight (lost, then thrown away by a resync): not waited for.
  book.OnHeartbeat(1, Beat(13, 50, {Counters(0, 0, 1)}), At(6));
  rs = book.Round(0, At(7), kNoTimings);
  REQUIRE(rs.learners.size() == 1);
  CHECK(rs.learners[0].learner == 0);
}


TEST_CASE("round book: lock-step: a round holding deltas of two cadence steps is at the earlier one",
          "[unit][sync][round_book]") {
  RoundBookOptions o = Options(3, 2);  // H = 10, P = 2: fragment 0 fires at 10, 20, 30..
  o.lock_step = true;
  RoundBook book(o, kStart);
  for (int l = 0; l < 3; l++) book.OnHeard(l, 1, At(0));
  // Learner 0's resend of its step-10 delta (sent at 12) and learner 2, a rejoiner ahead of the
  // fleet, firing at 20 share the open round.
  REQUIRE(book.Admit(Delta(0, 0, 0, 12, 12), 0, At(1)));
  REQUIRE(book.Admit(Delta(2, 0, 0, 10, 20), 0, At(2)));
  // Learner 1 at step 15, nothing in flight for fragment 0 (blocked on another fragment's round
  // that waits for learner 0): past the round of step 10, so not waited for. Judged by the
  // rejoiner's step 20, the round would wait for learner 1 to reach 20, which it never would.
  book.OnHeartbeat(1, Beat(15, 50, {Counters(0, 0, 5)}), At(3));
  const RoundState rs = book.Round(0, At(4), kNoTimings);
  REQUIRE(rs.learners.size() == 2);
  CHECK(rs.learners[0].learner == 0);
  CHECK(rs.learners[1].learner == 2);
}

}  // namespace diloco
