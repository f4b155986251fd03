// Goodput as a daemon job's syncer sees it (control/live_goodput.h): down spans from liveness
// and incarnations, nominal rates from heartbeats, merges from the syncer's merge tape.
#include "daemon/sync/live_goodput.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "tests/temp_dir.h"

namespace diloco {
namespace {

// tokens_per_s: the learner's nominal rate so far (its heartbeat's), over `tokens`.
LearnerStatusEntry Entry(int i, bool live, uint64_t incarnation, int64_t last_heard_ms, float tokens_per_s,
                         LearnerState state = LearnerState::kTraining, uint64_t tokens = 1000) {
  LearnerStatusEntry e;
  e.learner = i;
  e.heard = true;
  e.live = live;
  e.incarnation = incarnation;
  e.last_heard_unix_ms = last_heard_ms;
  e.tokens_per_s = tokens_per_s;
  e.tokens = tokens;
  e.state = state;
  return e;
}

SyncerStatusSnapshot Snapshot(std::vector<LearnerStatusEntry> learners) {
  SyncerStatusSnapshot s;
  s.running = true;
  s.learners = std::move(learners);
  return s;
}

// A merge as the syncer hands it over: contributors with their tokens, skipped deltas.
MergeEvent Merge(int64_t time_ms, int fragment, const std::vector<std::pair<int, double>>& contributors,
                 std::vector<SkippedDelta> skipped = {}) {
  MergeEvent e;
  e.time_ms = time_ms;
  e.fragment = fragment;
  e.reason = "quorum";
  for (const auto& [learner, tokens] : contributors) e.contributors.push_back({learner, 0, 0, 0, tokens, 0});
  e.skipped = std::move(skipped);
  return e;
}

LiveGoodputOptions Options(const MergeTape* merges) {
  LiveGoodputOptions o;
  o.learners = 2;
  o.fragment_weights = {0.5, 0.5};
  o.tokens_per_step = 100;
  o.inner_steps = 10;
  o.merges = merges;
  o.start_unix_ms = 100000;
  return o;
}

}  // namespace

TEST_CASE("live goodput: merged tokens over the provisioned rate, outages as down waste", "[unit]") {
  MergeTape tape;
  LiveGoodput g(Options(&tape));
  GoodputReport r;
  CHECK_FALSE(g.Report(101000, &r).ok());  // no rate heard yet

  // Both learners at 1000 tokens/s (a step every 0.1 s).
  g.Observe(Snapshot({Entry(0, true, 1, 101000, 1000), Entry(1, true, 7, 101000, 1000)}), 101000);
  // Learner 1 last heard at 102 s, declared dead at 104 s, back (new incarnation) at 105 s.
  g.Observe(Snapshot({Entry(0, true, 1, 104000, 1000), Entry(1, false, 7, 102000, 1000)}), 104000);
  g.Observe(Snapshot({Entry(0, true, 1, 105000, 1000), Entry(1, true, 8, 105000, 600)}), 105000);
  // Learner 0 restarts quicker than the timeout: down from its last heartbeat (106 s) to 106.5 s.
  g.Observe(Snapshot({Entry(0, true, 1, 106000, 1000), Entry(1, true, 8, 106000, 1000)}), 106000);
  g.Observe(Snapshot({Entry(0, true, 2, 106500, 1000), Entry(1, true, 8, 106500, 1000)}), 106500);
  tape.Add(Merge(103000, 0, {{0, 2000}, {1, 1000}}));
  tape.Add(Merge(107000, 1, {{0, 4000}}));
  REQUIRE(g.Report(110000, &r).ok());
  // Wall 10 s x 2000 tokens/s; merged 0.5 x 3000 + 0.5 x 4000.
  CHECK(r.provisioned_tokens == Approx(20000));
  CHECK(r.merged_tokens == Approx(3500));
  CHECK(r.goodput == Approx(3500.0 / 20000));
  CHECK(r.waste_down == Approx((3.0 + 0.5) * 1000 / 20000));
  CHECK(r.waste_dropped == 0);

  // A later merge counts; a dropped delta is dropped waste, a replaced one is not (its work
  // travels in the newer delta).
  tape.Add(Merge(108000, 0, {{1, 2000}}, {{0, "stale", "", 1000}, {1, "replaced", "", 500}}));
  REQUIRE(g.Report(110000, &r).ok());
  CHECK(r.merged_tokens == Approx(4500));
  CHECK(r.waste_dropped == Approx(0.5 * 1000 / 20000));
}

TEST_CASE("live goodput: a finished learner idles while the run goes on, and a dead one stays down", "[unit]") {
  MergeTape tape;
  LiveGoodput g(Options(&tape));
  g.Observe(Snapshot({Entry(0, true, 1, 101000, 1000), Entry(1, true, 1, 101000, 1000)}), 101000);
  g.Observe(Snapshot({Entry(0, false, 1, 104000, 1000, LearnerState::kFinished), Entry(1, false, 1, 102000, 1000)}),
            105000);
  GoodputReport r;
  REQUIRE(g.Report(110000, &r).ok());
  CHECK(r.waste_idle == Approx(5.0 * 1000 / 20000));  // finished at 105 s (first seen so)
  CHECK(r.waste_down == Approx(8.0 * 1000 / 20000));  // last heard at 102 s, still gone at 110 s
  CHECK(r.goodput == 0);
  CHECK(r.uptime < 1);
}

TEST_CASE("live goodput: a learner's nominal rate is its tokens over its provisioned time across incarnations", "[unit]") {
  MergeTape tape;
  LiveGoodput g(Options(&tape));
  // Learner 0: 3000 tokens at 1000/s (3 s), an earlier heartbeat of the same incarnation is
  // replaced by its latest; then a new incarnation, 1000 tokens at 500/s (2 s): 4000 / 5 s.
  g.Observe(Snapshot({Entry(0, true, 1, 101000, 700, LearnerState::kTraining, 700),
                      Entry(1, true, 1, 101000, 1000, LearnerState::kTraining, 1000)}),
            101000);
  g.Observe(Snapshot({Entry(0, true, 1, 103000, 1000, LearnerState::kTraining, 3000),
                      Entry(1, true, 1, 103000, 1000, LearnerState::kTraining, 3000)}),
            103000);
  g.Observe(Snapshot({Entry(0, true, 2, 105000, 500, LearnerState::kTraining, 1000),
                      Entry(1, true, 1, 105000, 1000, LearnerState::kTraining, 5000)}),
            105000);
  GoodputReport r;
  REQUIRE(g.Report(110000, &r).ok());
  CHECK(r.provisioned_tokens == Approx((800.0 + 1000.0) * 10));
}

TEST_CASE("merge tape: a resumed syncer's tape starts from its events.log and its stats count every merge", "[unit]") {
  testing::TempDir dir;
  const std::string events = dir.file("events.log");
  {
    EventLog log;
    REQUIRE(log.Open(events).ok());
    REQUIRE(log.Append(Merge(101000, 0, {{0, 100}, {1, 300}})).ok());
  }
  MergeTape tape;
  REQUIRE(tape.Load(events).ok());
  auto on_merge = tape.Listener();
  MergeEvent later = Merge(102000, 1, {{1, 50}});
  later.reason = "grace_expired";
  later.contributors[0].staleness = 3;
  on_merge(later);
  CHECK(tape.merges() == 2);
  std::vector<MergedDelta> merged;
  std::vector<LostDelta> lost;
  tape.GoodputRecords(100000, &merged, &lost);
  REQUIRE(merged.size() == 3);
  CHECK(merged[0].time_s == Approx(1.0));
  CHECK(merged[2].time_s == Approx(2.0));
  CHECK(merged[2].tokens == 50);
  nlohmann::json stats;
  tape.AddStatsTo(&stats);
  CHECK(stats["merge_reasons"]["quorum"] == 1);
  CHECK(stats["merge_reasons"]["grace_expired"] == 1);
  CHECK(stats["staleness"]["count"] == 3);
  CHECK(stats["staleness"]["max"] == 3.0);
  CHECK(stats["last_merge"]["fragment"] == 1);
  // A damaged log is an error naming the line, and nothing of it is taken.
  std::ofstream(events, std::ios::app) << "not json\n" << MergeEventToJson(later).dump() << "\n";
  MergeTape damaged;
  const Status st = damaged.Load(events);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("events.log line 2"));
  CHECK(damaged.merges() == 0);
  MergeTape none;
  CHECK(none.Load(dir.file("no-events.log")).ok());
  CHECK(none.merges() == 0);
}

}  // namespace diloco
