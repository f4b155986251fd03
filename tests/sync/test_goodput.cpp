#include "daemon/sync/goodput.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "daemon/sync/event_log.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

using diloco::testing::TempDir;

GoodputInput Run(std::vector<double> nominal, std::vector<double> weights, double wall_s, double interval_s) {
  GoodputInput in;
  in.nominal_tokens_per_s = std::move(nominal);
  in.fragment_weights = std::move(weights);
  in.wall_s = wall_s;
  in.expected_merge_interval_s = interval_s;
  return in;
}

GoodputReport Compute(const GoodputInput& in) {
  GoodputReport r;
  const Status st = ComputeGoodput(in, &r);
  INFO(st.message());
  REQUIRE(st.ok());
  return r;
}

// One learner, one fragment, a merge of 10 tokens at each of times.
GoodputInput MergesAt(std::vector<double> times, double wall_s = 100, double interval_s = 10) {
  GoodputInput in = Run({10}, {1}, wall_s, interval_s);
  for (double t : times) in.merged.push_back({t, 0, 0, 10});
  return in;
}

TEST_CASE("goodput: a fault-free run is all goodput, always up, no waste", "[unit][sync][goodput]") {
  // 2 learners at 100 and 200 tokens/s, 2 fragments (1/4, 3/4), 100 s; both
  // fragments merge every 20 s with each learner's 20 s of tokens.
  GoodputInput in = Run({100, 200}, {0.25, 0.75}, 100, 20);
  in.spans = {{0, 0, 100, Activity::kTraining}, {1, 0, 100, Activity::kTraining}};
  for (double t = 20; t <= 100; t += 20) {
    for (int p = 0; p < 2; ++p) {
      in.merged.push_back({t, p, 0, 2000});
      in.merged.push_back({t, p, 1, 4000});
    }
  }
  const GoodputReport r = Compute(in);
  // provisioned = (100 + 200) × 100; merged = (1/4 + 3/4) × 5 × (2000 + 4000).
  CHECK(r.provisioned_tokens == Approx(30000));
  CHECK(r.merged_tokens == Approx(30000));
  CHECK(r.goodput == Approx(1));
  CHECK(r.uptime == Approx(1));
  CHECK(r.waste_down == 0);
  CHECK(r.waste_blocked == 0);
  CHECK(r.waste_dropped == 0);
  CHECK(r.waste_discarded == 0);
  CHECK(r.down_s == std::vector<double>{0, 0});
  CHECK(r.blocked_s == std::vector<double>{0, 0});
}

TEST_CASE("goodput: one of two learners down 10% of the run costs 5%", "[unit][sync][goodput]") {
  // 2 learners at 100 tokens/s, 100 s; learner 1 is down for [40, 50), so its
  // delta merged at 60 carries 10 s of tokens instead of 20.
  GoodputInput in = Run({100, 100}, {1}, 100, 10);
  in.spans = {{0, 0, 100, Activity::kTraining},
              {1, 0, 40, Activity::kTraining},
              {1, 40, 50, Activity::kDown},
              {1, 50, 100, Activity::kTraining}};
  for (double t = 20; t <= 100; t += 20) {
    in.merged.push_back({t, 0, 0, 2000});
    in.merged.push_back({t, 0, 1, t == 60 ? 1000.0 : 2000.0});
  }
  const GoodputReport r = Compute(in);
  CHECK(r.provisioned_tokens == Approx(20000));
  CHECK(r.merged_tokens == Approx(19000));  // 5 × 2000 + 4 × 2000 + 1000
  CHECK(r.goodput == Approx(1 - 0.1 * 0.5));
  CHECK(r.waste_down == Approx(100.0 * 10 / 20000));
  CHECK(r.down_s == std::vector<double>{0, 10});
  CHECK(r.uptime == Approx(1));
}

TEST_CASE("goodput: a learner's time blocked at a barrier is waste at its nominal rate",
          "[unit][sync][goodput]") {
  GoodputInput in = Run({100, 300}, {1}, 10, 10);
  in.spans = {{1, 0, 5, Activity::kBlocked}, {1, 5, 8, Activity::kSyncing}, {1, 8, 10, Activity::kBlocked}};
  const GoodputReport r = Compute(in);
  CHECK(r.blocked_s == std::vector<double>{0, 7});
  CHECK(r.waste_blocked == Approx(300.0 * 7 / 4000));
  CHECK(r.waste_down == 0);  // kSyncing is in no waste bucket
}

TEST_CASE("goodput: a merge gap longer than 2x the interval costs the gap beyond 2x", "[unit][sync][goodput]") {
  // I = 10, wall 100. Merges every 10 s: always up.
  CHECK(Compute(MergesAt({10, 20, 30, 40, 50, 60, 70, 80, 90, 100})).uptime == Approx(1));
  // A gap of exactly 2·I is still up.
  CHECK(Compute(MergesAt({10, 20, 30, 50, 70, 80, 90, 100})).uptime == Approx(1));
  // 30 -> 80 is a 50 s gap: down from 30 + 20 to 80, 30 s of 100.
  CHECK(Compute(MergesAt({10, 20, 30, 80, 90, 100})).uptime == Approx(0.7));
}

TEST_CASE("goodput: uptime counts time 0 as a merge and runs to the wall time", "[unit][sync][goodput]") {
  // First merge at 35: [0, 20) is up from the start rule, [20, 35) is down.
  CHECK(Compute(MergesAt({35, 45, 55, 65, 75, 85, 95})).uptime == Approx(0.85));
  // A first merge by 2·I costs nothing.
  CHECK(Compute(MergesAt({20, 40, 60, 80, 100})).uptime == Approx(1));
  // No merge after 60: up until 80, down for the last 20 s.
  CHECK(Compute(MergesAt({10, 20, 30, 40, 50, 60})).uptime == Approx(0.8));
  // No merge at all: only the first 2·I.
  CHECK(Compute(MergesAt({})).uptime == Approx(0.2));
}

TEST_CASE("goodput: a delta merged for one fragment counts that fragment's weight", "[unit][sync][goodput]") {
  // One learner at 100 tokens/s for 10 s: 1000 provisioned.
  GoodputInput in = Run({100}, {0.25, 0.75}, 10, 10);
  in.merged = {{10, 1, 0, 1000}};
  GoodputReport r = Compute(in);
  CHECK(r.merged_tokens == Approx(750));
  CHECK(r.goodput == Approx(0.75));
  in.merged = {{10, 0, 0, 1000}};
  r = Compute(in);
  CHECK(r.merged_tokens == Approx(250));
  CHECK(r.goodput == Approx(0.25));
}

TEST_CASE("goodput: dropped and discarded deltas are weighted waste, not goodput", "[unit][sync][goodput]") {
  GoodputInput in = Run({100}, {0.25, 0.75}, 10, 10);
  in.merged = {{10, 0, 0, 1000}};
  in.lost = {{5, 1, 0, 400, LossCause::kDropped}, {6, 0, 0, 200, LossCause::kDiscarded}};
  const GoodputReport r = Compute(in);
  CHECK(r.waste_dropped == Approx(0.75 * 400 / 1000));
  CHECK(r.waste_discarded == Approx(0.25 * 200 / 1000));
  CHECK(r.goodput == Approx(0.25));
}

TEST_CASE("goodput: spans past the wall time are clipped", "[unit][sync][goodput]") {
  GoodputInput in = Run({100}, {1}, 100, 10);
  in.spans = {{0, 0, 90, Activity::kTraining}, {0, 90, 130, Activity::kDown}, {0, 140, 150, Activity::kDown}};
  const GoodputReport r = Compute(in);
  CHECK(r.down_s == std::vector<double>{10});
  CHECK(r.waste_down == Approx(0.1));
}

TEST_CASE("goodput: bad input is refused with a message naming it", "[unit][sync][goodput]") {
  auto valid = [] {
    GoodputInput in = Run({100, 100}, {0.5, 0.5}, 100, 10);
    in.spans = {{0, 0, 50, Activity::kTraining}, {0, 50, 60, Activity::kDown}};
    in.merged = {{10, 1, 1, 1000}};
    in.lost = {{10, 0, 0, 100, LossCause::kDropped}};
    return in;
  };
  GoodputReport r;
  REQUIRE(ComputeGoodput(valid(), &r).ok());

  struct Row {
    const char* name;
    std::function<void(GoodputInput&)> mutate;
    const char* message;
  };
  const std::vector<Row> rows = {
      {"weights", [](GoodputInput& in) { in.fragment_weights = {0.5, 0.4}; }, "fragment_weights sum to 0.9, not 1"},
      {"negative weight", [](GoodputInput& in) { in.fragment_weights = {1.5, -0.5}; }, "fragment_weights[1]"},
      {"no fragments", [](GoodputInput& in) { in.fragment_weights.clear(); }, "no fragments"},
      {"no learners", [](GoodputInput& in) { in.nominal_tokens_per_s.clear(); }, "no learners"},
      {"zero rate", [](GoodputInput& in) { in.nominal_tokens_per_s = {0, 0}; }, "nothing was provisioned"},
      {"wall", [](GoodputInput& in) { in.wall_s = 0; }, "wall_s must be > 0"},
      {"interval", [](GoodputInput& in) { in.expected_merge_interval_s = -1; }, "expected_merge_interval_s"},
      {"negative span", [](GoodputInput& in) { in.spans[1].start_s = -1; }, "spans[1]: start_s/end_s -1/60"},
      {"backwards span", [](GoodputInput& in) { in.spans[1].end_s = 40; }, "spans[1]: ends (40)"},
      {"span learner", [](GoodputInput& in) { in.spans[0].learner = 2; }, "spans[0]: unknown learner 2"},
      {"overlap", [](GoodputInput& in) { in.spans[1].start_s = 45; }, "learner 0: spans overlap at 45"},
      {"merge fragment", [](GoodputInput& in) { in.merged[0].fragment = 2; }, "merged[0]: unknown fragment 2"},
      {"merge learner", [](GoodputInput& in) { in.merged[0].learner = -1; }, "merged[0]: unknown learner -1"},
      {"merge time", [](GoodputInput& in) { in.merged[0].time_s = -0.5; }, "merged[0]: time_s -0.5"},
      {"merge late", [](GoodputInput& in) { in.merged[0].time_s = 101; }, "merged[0]: time_s 101 is after wall_s"},
      {"merge tokens", [](GoodputInput& in) { in.merged[0].tokens = -1; }, "merged[0]: tokens -1"},
      {"lost fragment", [](GoodputInput& in) { in.lost[0].fragment = 5; }, "lost[0]: unknown fragment 5"},
      {"lost learner", [](GoodputInput& in) { in.lost[0].learner = 3; }, "lost[0]: unknown learner 3"},
  };
  for (const Row& row : rows) {
    INFO(row.name);
    GoodputInput in = valid();
    row.mutate(in);
    const Status st = ComputeGoodput(in, &r);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains(row.message));
    std::vector<GoodputPoint> points;
    CHECK_FALSE(GoodputOverTime(in, 10, &points).ok());
  }
}

TEST_CASE("goodput: over time, per bucket", "[unit][sync][goodput]") {
  // One learner at 10 tokens/s, I = 10 (up for 20 s after each merge).
  GoodputInput in = Run({10}, {1}, 100, 10);
  in.merged = {{10, 0, 0, 100}, {20, 0, 0, 100}, {100, 0, 0, 800}};
  std::vector<GoodputPoint> points;
  REQUIRE(GoodputOverTime(in, 25, &points).ok());
  REQUIRE(points.size() == 4);
  // Up: [0, 40) and the instant 100. Each bucket provisions 10 × 25 = 250.
  CHECK(points[0].start_s == 0);
  CHECK(points[0].end_s == 25);
  CHECK(points[0].goodput == Approx(200.0 / 250));
  CHECK(points[0].uptime == Approx(1));
  CHECK(points[0].up);
  CHECK(points[1].goodput == 0);
  CHECK(points[1].uptime == Approx(15.0 / 25));
  CHECK_FALSE(points[1].up);
  CHECK(points[2].uptime == 0);
  CHECK(points[3].end_s == 100);
  CHECK(points[3].goodput == Approx(800.0 / 250));  // a merge at wall_s lands in the last bucket
  CHECK(points[3].uptime == 0);

  // A wall time that is not a multiple of the bucket: a shorter last bucket.
  in.wall_s = 90;
  in.merged.pop_back();
  REQUIRE(GoodputOverTime(in, 25, &points).ok());
  REQUIRE(points.size() == 4);
  CHECK(points[3].start_s == 75);
  CHECK(points[3].end_s == 90);

  CHECK_FALSE(GoodputOverTime(in, 0, &points).ok());
}

// A learner done with its steps while a restarted one catches up: its idle time is waste too.
TEST_CASE("goodput: a learner idle after its last step is idle waste", "[unit][sync][goodput]") {
  GoodputInput in;
  in.wall_s = 100;
  in.nominal_tokens_per_s = {10, 10};
  in.fragment_weights = {1.0};
  in.expected_merge_interval_s = 10;
  in.spans = {{0, 80, 100, Activity::kIdle}};
  GoodputReport r;
  REQUIRE(ComputeGoodput(in, &r).ok());
  CHECK(r.waste_idle == Approx(20.0 * 10 / 2000));  // 20 s of one learner at 10 tok/s of 2000
  CHECK(r.waste_down == 0);
}

TEST_CASE("goodput: the report as JSON", "[unit][sync][goodput]") {
  GoodputReport r;
  r.goodput = 0.5;
  r.uptime = 0.75;
  r.waste_down = 0.125;
  r.waste_blocked = 0.25;
  r.waste_dropped = 0.0625;
  r.waste_discarded = 0.03125;
  r.waste_idle = 0.015625;
  r.merged_tokens = 1000;
  r.provisioned_tokens = 2000;
  CHECK(GoodputToJson(r) == nlohmann::json{{"goodput", 0.5},
                                           {"uptime", 0.75},
                                           {"waste",
                                            {{"down", 0.125},
                                             {"blocked", 0.25},
                                             {"dropped", 0.0625},
                                             {"discarded", 0.03125},
                                             {"idle", 0.015625}}},
                                           {"merged_tokens", 1000.0},
                                           {"provisioned_tokens", 2000.0}});
}

TEST_CASE("goodput: merged deltas from the syncer's events.log", "[unit][sync][goodput]") {
  TempDir dir;
  const std::string path = dir.file("events.log");
  const int64_t start_ms = 1767225600000;
  {
    EventLog log;
    REQUIRE(log.Open(path).ok());
    MergeEvent a;
    a.time_ms = start_ms + 2500;
    a.fragment = 1;
    a.contributors = {{0, 0.75, 0, 3, 9216, 12}, {2, 0.25, 1, 2, 3072, 4}};
    a.skipped = {{1, "too_stale", "base 0, current 3"}};
    REQUIRE(log.Append(a).ok());
    MergeEvent b;
    b.time_ms = start_ms + 4000;
    b.fragment = 0;
    b.contributors = {{1, 1, 0, 5, 100, 1}};
    REQUIRE(log.Append(b).ok());
  }
  std::ofstream(path, std::ios::app) << "{\"event\":\"note\"}\n{\"event\":\"merge\",\"time_";
  std::vector<MergedDelta> merged;
  const Status st = ReadMergedDeltas(path, start_ms, &merged);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(merged.size() == 3);
  CHECK(merged[0].time_s == 2.5);
  CHECK(merged[0].fragment == 1);
  CHECK(merged[0].learner == 0);
  CHECK(merged[0].tokens == 9216);
  CHECK(merged[1].learner == 2);
  CHECK(merged[1].tokens == 3072);
  CHECK(merged[2].time_s == 4);
  CHECK(merged[2].fragment == 0);
  CHECK(merged[2].learner == 1);

  // A damaged line that is not the last one is an error, and nothing is appended.
  const std::string bad = dir.Write("bad.log", "{\"event\":\"merge\",\"ti\n{\"event\":\"note\"}\n");
  std::vector<MergedDelta> none;
  const Status bad_st = ReadMergedDeltas(bad, start_ms, &none);
  CHECK_THAT(bad_st.message(), Catch::Contains("bad.log line 1: not JSON"));
  CHECK(none.empty());
  const std::string missing = dir.Write("missing.log", "{\"event\":\"merge\",\"time_ms\":1}\n");
  CHECK_THAT(ReadMergedDeltas(missing, 0, &none).message(), Catch::Contains("missing.log line 1"));
  CHECK_FALSE(ReadMergedDeltas(dir.file("nope.log"), 0, &none).ok());
}

}  // namespace
}  // namespace diloco
