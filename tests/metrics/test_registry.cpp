#include "daemon/metrics/registry.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace diloco {
namespace {

TEST_CASE("MetricsRegistry: renders the text format exactly, families by name, series by labels",
          "[unit]") {
  MetricsRegistry r;
  REQUIRE(r.Declare("dilocod_steps_total", MetricKind::kCounter, "Inner steps.", {"job", "learner"}).ok());
  REQUIRE(r.Declare("dilocod_loss", MetricKind::kGauge, "Latest loss.\nper learner \\ job", {"job", "learner"}).ok());
  REQUIRE(r.Declare("dilocod_live_peers", MetricKind::kGauge, "Live peers.").ok());
  REQUIRE(r.Declare("dilocod_unused", MetricKind::kGauge, "Never set: not rendered.").ok());
  r.Add("dilocod_steps_total", {"j2", "1"}, 3);
  r.Add("dilocod_steps_total", {"j2", "0"}, 5);
  r.Add("dilocod_steps_total", {"j2", "0"}, 2);
  r.Add("dilocod_steps_total", {"j2", "0"}, -4);  // ignored: counters only go up
  r.Set("dilocod_loss", {"j\"1\"", "a\\b\nc"}, 2.5);
  r.Set("dilocod_loss", {"j2", "0"}, 0.1);
  r.Set("dilocod_live_peers", {}, 3);

  const std::string want =
      "# HELP dilocod_live_peers Live peers.\n"
      "# TYPE dilocod_live_peers gauge\n"
      "dilocod_live_peers 3\n"
      "# HELP dilocod_loss Latest loss.\\nper learner \\\\ job\n"
      "# TYPE dilocod_loss gauge\n"
      "dilocod_loss{job=\"j\\\"1\\\"\",learner=\"a\\\\b\\nc\"} 2.5\n"
      "dilocod_loss{job=\"j2\",learner=\"0\"} 0.1\n"
      "# HELP dilocod_steps_total Inner steps.\n"
      "# TYPE dilocod_steps_total counter\n"
      "dilocod_steps_total{job=\"j2\",learner=\"0\"} 7\n"
      "dilocod_steps_total{job=\"j2\",learner=\"1\"} 3\n";
  CHECK(r.Render() == want);
  // Unchanged values render identically (stable order).
  CHECK(r.Render() == want);

  double v = 0;
  REQUIRE(r.Get("dilocod_steps_total", {"j2", "0"}, &v));
  CHECK(v == 7);
  CHECK_FALSE(r.Get("dilocod_steps_total", {"j9", "0"}, &v));
  CHECK_FALSE(r.Get("nope", {}, &v));
}

TEST_CASE("MetricsRegistry: values print as Prometheus reads them", "[unit]") {
  CHECK(FormatMetricValue(12) == "12");
  CHECK(FormatMetricValue(0.1) == "0.1");
  CHECK(FormatMetricValue(-3.25) == "-3.25");
  CHECK(FormatMetricValue(1e20) == "1e+20");
  CHECK(FormatMetricValue(123456789012.0) == "123456789012");
  CHECK(FormatMetricValue(std::nan("")) == "NaN");
  CHECK(FormatMetricValue(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(FormatMetricValue(-std::numeric_limits<double>::infinity()) == "-Inf");
}

TEST_CASE("MetricsRegistry: bad names and conflicting declarations are errors", "[unit]") {
  MetricsRegistry r;
  Status st = r.Declare("9lives", MetricKind::kGauge, "x");
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("'9lives'"));
  st = r.Declare("a-b", MetricKind::kGauge, "x");
  CHECK_FALSE(st.ok());
  st = r.Declare("ok_name", MetricKind::kGauge, "x", {"__reserved"});
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("'__reserved'"));
  st = r.Declare("ok_name", MetricKind::kGauge, "x", {"has:colon"});
  CHECK_FALSE(st.ok());

  REQUIRE(r.Declare("m_total", MetricKind::kCounter, "first", {"job"}).ok());
  CHECK(r.Declare("m_total", MetricKind::kCounter, "again", {"job"}).ok());
  st = r.Declare("m_total", MetricKind::kGauge, "x", {"job"});
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("m_total") && Catch::Contains("counter"));
  CHECK_FALSE(r.Declare("m_total", MetricKind::kCounter, "x", {"job", "learner"}).ok());
}

TEST_CASE("MetricsRegistry: RemoveWithLabel drops a job's series in every family", "[unit]") {
  MetricsRegistry r;
  REQUIRE(r.Declare("steps_total", MetricKind::kCounter, "s", {"job", "learner"}).ok());
  REQUIRE(r.Declare("merges_total", MetricKind::kCounter, "m", {"job"}).ok());
  REQUIRE(r.Declare("live_peers", MetricKind::kGauge, "l").ok());
  r.Add("steps_total", {"a", "0"}, 1);
  r.Add("steps_total", {"b", "0"}, 1);
  r.Add("merges_total", {"a"}, 4);
  r.Set("live_peers", {}, 2);
  CHECK(r.RemoveWithLabel("job", "a") == 2);
  const std::string text = r.Render();
  CHECK(text.find("job=\"a\"") == std::string::npos);
  CHECK(text.find("steps_total{job=\"b\",learner=\"0\"} 1\n") != std::string::npos);
  CHECK(text.find("live_peers 2\n") != std::string::npos);
  CHECK(text.find("merges_total") == std::string::npos);  // no series left: not rendered
}

TEST_CASE("MetricsRegistry: concurrent adds from several threads are all counted", "[unit]") {
  MetricsRegistry r;
  REQUIRE(r.Declare("c_total", MetricKind::kCounter, "c", {"t"}).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&r] {
      for (int i = 0; i < 10000; i++) {
        r.Add("c_total", {"x"}, 1);
        if (i % 1000 == 0) (void)r.Render();
      }
    });
  for (auto& t : threads) t.join();
  double v = 0;
  REQUIRE(r.Get("c_total", {"x"}, &v));
  CHECK(v == 40000);
}

}  // namespace
}  // namespace diloco
