// Goodput as a daemon job's syncer sees it (control/live_goodput.h): down spans from liveness
// and incarnations, nominal rates from heartbeats, merges from an events.log that grows.
#include "daemon/control/live_goodput.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "tests/temp_dir.h"

namespace diloco {
namespace {

LearnerStatusEntry Entry(int i, bool live, uint64_t incarnation, int64_t last_heard_ms, float tokens_per_s,
                         LearnerState state = LearnerState::kTraining) {
  LearnerStatusEntry e;
  e.learner = i;
  e.heard = true;
  e.live = live;
  e.incarnation = incarnation;
  e.last_heard_unix_ms = last_heard_ms;
  e.tokens_per_s = tokens_per_s;
  e.state = state;
  return e;
}

SyncerStatusSnapshot Snapshot(std::vector<LearnerStatusEntry> learners) {
  SyncerStatusSnapshot s;
  s.running = true;
  s.learners = std::move(learners);
  return s;
}

// A merge line as the syncer writes it (event_log.h): contributors with their tokens.
std::string MergeLine(int64_t time_ms, int fragment, const std::vector<std::pair<int, double>>& contributors,
                      const std::string& skipped = "[]") {
  std::ostringstream line;
  line << "{\"event\":\"merge\",\"time_ms\":" << time_ms << ",\"fragment\":" << fragment
       << ",\"version\":1,\"reason\":\"quorum\",\"contributors\":[";
  for (size_t k = 0; k < contributors.size(); k++)
    line << (k ? "," : "") << "{\"learner\":" << contributors[k].first << ",\"tokens\":" << contributors[k].second << "}";
  line << "],\"skipped\":" << skipped << "}\n";
  return line.str();
}

LiveGoodputOptions Options(const std::string& events) {
  LiveGoodputOptions o;
  o.learners = 2;
  o.fragment_weights = {0.5, 0.5};
  o.tokens_per_step = 100;
  o.inner_steps = 10;
  o.events_path = events;
  o.start_unix_ms = 100000;
  return o;
}

}  // namespace

TEST_CASE("live goodput: merged tokens over the provisioned rate, outages as down waste", "[unit]") {
  testing::TempDir dir;
  const std::string events = dir.file("events.log");
  LiveGoodput g(Options(events));
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
  {
    std::ofstream f(events);
    f << MergeLine(103000, 0, {{0, 2000}, {1, 1000}}) << MergeLine(107000, 1, {{0, 4000}});
    f << "{\"event\":\"merge\",\"time_ms\":";  // being written: not read yet
  }
  REQUIRE(g.Report(110000, &r).ok());
  // Wall 10 s x 2000 tokens/s; merged 0.5 x 3000 + 0.5 x 4000.
  CHECK(r.provisioned_tokens == Approx(20000));
  CHECK(r.merged_tokens == Approx(3500));
  CHECK(r.goodput == Approx(3500.0 / 20000));
  CHECK(r.waste_down == Approx((3.0 + 0.5) * 1000 / 20000));
  CHECK(r.waste_dropped == 0);

  // The half-written line, once whole, counts; a dropped delta is dropped waste.
  {
    std::ofstream f(events, std::ios::app);
    f << "108000,\"fragment\":0,\"version\":2,\"reason\":\"quorum\",\"contributors\":[{\"learner\":1,\"tokens\":"
         "2000}],\"skipped\":[{\"learner\":0,\"why\":\"stale\",\"tokens\":1000}]}\n";
  }
  REQUIRE(g.Report(110000, &r).ok());
  CHECK(r.merged_tokens == Approx(4500));
  CHECK(r.waste_dropped == Approx(0.5 * 1000 / 20000));
}

TEST_CASE("live goodput: a finished learner idles while the run goes on, and a dead one stays down", "[unit]") {
  testing::TempDir dir;
  LiveGoodput g(Options(dir.file("events.log")));
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

TEST_CASE("a damaged events.log line is an error that names the line", "[unit]") {
  testing::TempDir dir;
  const std::string events = dir.file("events.log");
  std::ofstream(events) << MergeLine(101000, 0, {{0, 100}}) << "not json\n";
  MergeTapeReader tape(events);
  std::vector<MergedDelta> merged;
  std::vector<LostDelta> lost;
  const Status st = tape.ReadNew(100000, &merged, &lost);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("events.log line 2"));
  CHECK(merged.size() == 1);
  CHECK(merged[0].time_s == Approx(1.0));
  // Read past it: later lines still count.
  std::ofstream(events, std::ios::app) << MergeLine(102000, 1, {{1, 50}});
  REQUIRE(tape.ReadNew(100000, &merged, &lost).ok());
  CHECK(merged.size() == 2);
}

}  // namespace diloco
