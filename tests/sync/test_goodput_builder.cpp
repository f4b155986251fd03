// GoodputBuilder (sync/goodput_builder.h): the one way every runtime turns its records into
// ComputeGoodput's input.
#include "daemon/sync/goodput_builder.h"

#include <catch2/catch.hpp>

namespace diloco {
namespace {

constexpr int64_t kStart = 1767225600000;  // the run's start, Unix ms

}  // namespace

TEST_CASE("goodput builder: nominal rates over incarnations and the merge interval of the slowest", "[unit]") {
  // 2 learners, 2 fragments (weights 0.25 / 0.75), 100 tokens a step, H = 10.
  GoodputBuilder b(kStart, 2, {0.25, 0.75}, 100, 10);
  b.AddWork(0, 3000, 3.0);  // an incarnation: 1000 tokens/s
  b.AddWork(0, 1000, 2.0);  // the next, slower: together 4000 / 5 s
  b.AddWork(1, 2000, 4.0);  // 500 tokens/s: a step every 0.2 s
  GoodputInput in;
  REQUIRE(b.Build(kStart + 10000, &in).ok());
  CHECK(in.wall_s == Approx(10));
  REQUIRE(in.nominal_tokens_per_s.size() == 2);
  CHECK(in.nominal_tokens_per_s[0] == Approx(800));
  CHECK(in.nominal_tokens_per_s[1] == Approx(500));
  CHECK(in.expected_merge_interval_s == Approx(10 * 0.2 / 2));
  CHECK(in.fragment_weights == std::vector<double>{0.25, 0.75});
}

TEST_CASE("goodput builder: the wall runs to the last merge and times are clipped to it", "[unit]") {
  GoodputBuilder b(kStart, 1, {1.0}, 100, 1);
  b.AddWork(0, 1000, 1.0);
  b.AddMerged(kStart - 500, 0, 0, 100);   // stamped before the start (a resumed syncer's): at 0
  b.AddMerged(kStart + 12000, 0, 0, 200);  // the flush merged after the learners' end
  b.AddLost(kStart + 11000, 0, 0, 50, LossCause::kDropped);
  b.AddSpan(0, kStart + 9000, 0, Activity::kIdle);  // open: to the end
  GoodputInput in;
  REQUIRE(b.Build(kStart + 10000, &in).ok());
  CHECK(in.wall_s == Approx(12));
  REQUIRE(in.merged.size() == 2);
  CHECK(in.merged[0].time_s == 0);
  CHECK(in.merged[1].time_s == Approx(12));
  REQUIRE(in.spans.size() == 1);
  CHECK(in.spans[0].start_s == Approx(9));
  CHECK(in.spans[0].end_s == Approx(12));
  GoodputReport r;
  CHECK(ComputeGoodput(in, &r).ok());
}

TEST_CASE("goodput builder: a down span wins over the wait it interrupts", "[unit]") {
  GoodputBuilder b(kStart, 1, {1.0}, 100, 1);
  b.AddWork(0, 1000, 1.0);
  b.AddSpan(0, kStart + 1000, kStart + 4000, Activity::kBlocked);
  b.AddSpan(0, kStart + 3000, kStart + 6000, Activity::kDown);  // killed while blocked
  b.AddSpan(0, kStart + 5000, kStart + 7000, Activity::kBlocked);  // blocked again after the restart
  GoodputInput in;
  REQUIRE(b.Build(kStart + 10000, &in).ok());
  REQUIRE(in.spans.size() == 3);
  CHECK(in.spans[0].activity == Activity::kBlocked);
  CHECK(in.spans[0].end_s == Approx(3));
  CHECK(in.spans[1].activity == Activity::kDown);
  CHECK(in.spans[1].start_s == Approx(3));
  CHECK(in.spans[1].end_s == Approx(6));
  CHECK(in.spans[2].start_s == Approx(6));  // the later wait starts when the learner is back
  GoodputReport r;
  REQUIRE(ComputeGoodput(in, &r).ok());
  CHECK(r.waste_down == Approx(3.0 / 10));
  CHECK(r.waste_blocked == Approx((2.0 + 1.0) / 10));
}

TEST_CASE("goodput builder: no step done is an error and not a goodput of 0", "[unit]") {
  GoodputBuilder b(kStart, 2, {1.0}, 100, 1);
  b.AddWork(0, 0, 0);
  GoodputInput in;
  const Status st = b.Build(kStart + 1000, &in);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("no learner has a nominal rate"));
}

}  // namespace diloco
