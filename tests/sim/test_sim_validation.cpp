// The simulator against a real run: `dilococtl train` of a small run config (M = 4, a kill and
// a straggler) and `dilococtl simulate`'s engine on the same config agree on the merges and the
// contributors per merge. Its own executable: it runs alone (RUN_SERIAL), since the real run's
// pace is what the machine's load makes it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "daemon/sim/simulator.h"
#include "tests/report/report_page.h"
#include "tests/temp_dir.h"
#include "tests/text_corpus.h"

namespace diloco {

using testing::ReadFile;
using testing::Shell;
using testing::TempDir;

// The small scenario of the issue: M = 4, learner 1 killed and restarted, learner 3 twice as
// slow as the others, trained for real by `dilococtl train` and simulated with the step time the
// real run measured (and the run config's slowdowns and kill). The merges and the contributors
// per merge agree within 10%.
TEST_CASE("simulate: a small run agrees with the real local run on merges and contributors", "[sim][e2e]") {
  TempDir dir;
  dir.Write("corpus.txt", testing::NumberedLines(2000));
  // A tiny model with large slowdowns: a step is mostly sleep, so the four learners stay off
  // each other's cores and their paces hold when the others finish.
  dir.Write("run.yaml",
            "model: {n_layer: 1, n_embd: 32, n_head: 2, block_size: 32}\n"
            "data: {corpus: corpus.txt}\n"
            "train: {batch_size: 4, steps: 300, warmup_steps: 5, threads: 1, log_every: 10, seed: 1}\n"
            "eval: {every: 0, batches: 2}\n"
            "sync: {learners: 4, fragments: 2, inner_steps: 10, quorum: 4, heartbeat_timeout_ms: 1000}\n"
            "learners: [{slowdown: 40}, {slowdown: 40}, {slowdown: 40}, {slowdown: 80}]\n"
            "chaos:\n  events:\n    - {at_s: 1.5, kill: {learner: 1, restart_after_s: 1.0}}\n");
  // Two real runs (their merges vary by a few percent with the machine's load): the mean of
  // their merges and contributors, and the fast learners' own time per step (the median wall
  // time per step between their metrics lines, which skips the kill's gap, over their slowdown).
  double merges = 0, contributors = 0;
  std::vector<double> per_step_ms;
  for (const std::string out : {"real-1", "real-2"}) {
    const int rc = Shell(dir.path(), std::string(DILOCO_BINARY_DIR "/bin/dilococtl") + " train run.yaml --out " + out + " --json", out);
    INFO(ReadFile(dir.path() / (out + ".err")));
    REQUIRE(rc == 0);
    for (std::ifstream in(dir.path() / out / "events.log"); in;) {
      std::string line;
      if (!std::getline(in, line) || line.empty()) continue;
      const nlohmann::json ev = nlohmann::json::parse(line);
      if (ev.value("event", "") != "merge") continue;
      merges += 0.5;
      contributors += 0.5 * ev["contributors"].size();
    }
    for (int l = 0; l < 3; l++) {  // the fast learners' lines (learner-<i>.jsonl)
      std::pair<int64_t, long> last{0, 0};
      for (std::ifstream in(dir.path() / out / ("learner-" + std::to_string(l) + ".jsonl")); in;) {
        std::string line;
        if (!std::getline(in, line) || line.empty()) continue;
        const nlohmann::json m = nlohmann::json::parse(line);
        if (!m.contains("time_ms")) continue;
        const int64_t t = m["time_ms"];
        const long step = m["step"];
        if (last.first > 0 && step > last.second)
          per_step_ms.push_back(double(t - last.first) / double(step - last.second));
        last = {t, step};
      }
    }
  }
  REQUIRE(merges > 20);
  REQUIRE(per_step_ms.size() >= 10);
  std::sort(per_step_ms.begin(), per_step_ms.end());
  const double step_s = per_step_ms[per_step_ms.size() / 2] / 40 / 1e3;
  dir.Write("sim.yaml", "run: run.yaml\nhours: 0\nstep_s: " + std::to_string(step_s) +
                            "\nstep_jitter: 0.1\nchip_mtbf_h: 0\nheartbeat_s: 0.2\nwan_gbps: 10\n"
                            "wan_latency_ms: 0.05\nmerge_gbps: 2\n");
  Scenario scenario;
  REQUIRE(LoadScenario(dir.file("sim.yaml"), {}, &scenario).ok());
  SimResult sim;
  REQUIRE(Simulate(scenario, SimMode::kDecoupled, &sim).ok());
  INFO("real (mean of 2): " << merges << " merges, " << contributors / merges << " contributors; simulated (step "
                << step_s * 1e3 << " ms): " << sim.merges << " merges, " << sim.contributors_mean
                << " contributors");
  CHECK(std::fabs(sim.merges - merges) <= 0.1 * merges);
  CHECK(std::fabs(sim.contributors_mean - contributors / merges) <= 0.1 * contributors / merges);
  CHECK(sim.failures == 1);
}

}  // namespace diloco
