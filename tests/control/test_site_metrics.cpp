// A site's /metrics: its families (control/site_metrics.h) from the roles' progress, and the
// real Prometheus linter (`promtool check metrics`, Debian's prometheus package) on every daemon
// of a cluster that is training.
#include <cstdio>

#include "daemon/control/site_metrics.h"
#include "tests/control/daemon_testing.h"

namespace diloco {
namespace {

using namespace testing;

// `promtool check metrics` on text: its exit code and what it printed (-1: no promtool).
int Promtool(const testing::TempDir& dir, const std::string& text, std::string* out) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) return -1;
  const std::string file = dir.Write("metrics.txt", text);
  const std::string cmd = "promtool check metrics < '" + file + "' > '" + dir.file("promtool.out") + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  *out = ReadFile(dir.file("promtool.out"));
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST_CASE("site metrics: a syncer's progress becomes its series, per learner apart from liveness", "[unit]") {
  MetricsRegistry r;
  REQUIRE(DeclareSiteMetrics(&r).ok());
  const nlohmann::json syncer = {
      {"merges", 12},
      {"versions", {3, 4}},
      {"bytes_received", 1000},
      {"learners",
       {{{"learner", 0}, {"live", true}, {"merged", 7}, {"merged_tokens", 700}, {"dropped", 1}},
        {{"learner", 1}, {"live", false}, {"merged", 5}, {"merged_tokens", 500}, {"rejected", 2}}}},
      {"merge_reasons", {{"quorum", 10}, {"grace_expired", 2}}},
      {"staleness", {{"sum", 6}, {"count", 12}, {"max", 2}}},
      {"goodput", {{"goodput", 0.8}, {"uptime", 0.9}, {"waste", {{"down", 0.1}, {"dropped", 0.05}, {"idle", 0.05}}}}}};
  MirrorRoleProgress(&r, "j1", "syncer", syncer);
  MirrorRoleProgress(&r, "j1", "learner-0", {{"learner", 0}, {"step", 40}, {"tokens", 4000}, {"loss", 2.5}});
  MirrorRoleProgress(&r, "j1", "learner-1", {{"learner", 1}, {"phase", "starting"}});  // nothing yet
  const std::string text = r.Render();
  for (const char* line : {"dilocod_syncer_merges_total{job=\"j1\",shard=\"0\"} 12\n",
                           "dilocod_syncer_version{job=\"j1\",shard=\"0\",fragment=\"1\"} 4\n",
                           "dilocod_syncer_received_bytes_total{job=\"j1\",shard=\"0\"} 1000\n",
                           "dilocod_syncer_live_learners{job=\"j1\",shard=\"0\"} 1\n",
                           "dilocod_syncer_learner_up{job=\"j1\",shard=\"0\",learner=\"1\"} 0\n",
                           "dilocod_syncer_learner_merged_deltas_total{job=\"j1\",shard=\"0\",learner=\"1\"} 5\n",
                           "dilocod_syncer_learner_merged_tokens_total{job=\"j1\",shard=\"0\",learner=\"0\"} 700\n",
                           "dilocod_syncer_learner_rejected_deltas_total{job=\"j1\",shard=\"0\",learner=\"1\"} 2\n",
                           "dilocod_syncer_rounds_total{job=\"j1\",shard=\"0\",reason=\"grace_expired\"} 2\n",
                           "dilocod_syncer_merged_staleness_versions_total{job=\"j1\",shard=\"0\"} 6\n",
                           "dilocod_syncer_merged_contributions_total{job=\"j1\",shard=\"0\"} 12\n",
                           "dilocod_syncer_max_staleness_versions{job=\"j1\",shard=\"0\"} 2\n",
                           "dilocod_job_waste_ratio{job=\"j1\",shard=\"0\",cause=\"down\"} 0.1\n",
                           "dilocod_learner_steps{job=\"j1\",learner=\"0\"} 40\n"}) {
    INFO(line);
    CHECK(text.find(line) != std::string::npos);
  }
  CHECK(text.find("dilocod_learner_steps{job=\"j1\",learner=\"1\"}") == std::string::npos);
  // A shard of several: its own label, and only the versions of the fragments it merges.
  nlohmann::json shard1 = syncer;
  shard1["shard"] = 1;
  shard1["fragments"] = {1};
  MirrorRoleProgress(&r, "j1", "syncer-1", shard1);
  const std::string text1 = r.Render();
  CHECK(text1.find("dilocod_syncer_version{job=\"j1\",shard=\"1\",fragment=\"1\"} 4\n") != std::string::npos);
  CHECK(text1.find("dilocod_syncer_version{job=\"j1\",shard=\"1\",fragment=\"0\"}") == std::string::npos);
  CHECK(text1.find("dilocod_syncer_merges_total{job=\"j1\",shard=\"1\"} 12\n") != std::string::npos);
}

TEST_CASE("promtool accepts every daemon's /metrics while a job trains", "[e2e]") {
  testing::TempDir dir;
  std::string lint;
  if (Promtool(dir, "# HELP x_total x\n# TYPE x_total counter\nx_total 1\n", &lint) < 0) {
    WARN("promtool is not installed (Debian package prometheus; scripts/setup.sh installs it): test skipped");
    return;
  }
  auto c = StartCluster(dir, /*metrics=*/true);
  const std::string job = SubmitPaced(dir, *c);
  WaitStatus(*c, "site-s", job, [](const nlohmann::json& s) { return s["syncer"]["progress"].value("merges", 0) >= 3; }, 60,
             "three merges");
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // the metrics are refreshed once a second
  for (const std::string& site : c->sites()) {
    const std::string text = HttpGetMetrics(c->MetricsPort(site));
    INFO(site << ":\n" << text);
    REQUIRE(!text.empty());
    const int rc = Promtool(dir, text, &lint);
    INFO("promtool: " << lint);
    CHECK(rc == 0);
    CHECK(lint.empty());  // no lint warnings either
    if (site == "site-s") {
      for (const char* family : {"dilocod_syncer_learner_up{", "dilocod_syncer_learner_merged_deltas_total{",
                                 "dilocod_syncer_merged_staleness_versions_total{", "dilocod_job_goodput_ratio{",
                                 "dilocod_syncer_received_bytes_total{"}) {
        INFO(family);
        CHECK(text.find(family) != std::string::npos);
      }
    } else {
      CHECK(text.find("dilocod_learner_steps{") != std::string::npos);
    }
  }
  REQUIRE(Ctl(dir, "stop " + job + " --socket '" + c->SocketPath("site-a") + "'").exit_code == 0);
}

}  // namespace diloco
