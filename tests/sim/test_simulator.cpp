// The simulator (daemon/sim): scenario errors, its rules on small cases, and the validation
// against `dilococtl train` of the same run config (a kill and a straggler).
#include "daemon/sim/simulator.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/report/report_page.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

using testing::ReadFile;
using testing::Shell;
using testing::TempDir;

const std::string kDilococtl = DILOCO_BINARY_DIR "/bin/dilococtl";

// A small model (only its shape matters) and a scenario around it.
std::string WriteScenario(const TempDir& dir, const std::string& sync, const std::string& scenario_keys) {
  dir.Write("corpus.txt", "not read by the simulator\n");
  dir.Write("run.yaml",
            "model: {n_layer: 2, n_embd: 64, n_head: 4, block_size: 64}\n"
            "data: {corpus: corpus.txt}\n"
            "train: {batch_size: 8, steps: 200}\n"
            "sync: {" + sync + "}\n");
  return dir.Write("sim.yaml", "run: run.yaml\n" + scenario_keys);
}

SimResult Run(const std::string& path, SimMode mode) {
  Scenario s;
  const Status st = LoadScenario(path, {}, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  SimResult r;
  const Status sim = Simulate(s, mode, &r);
  INFO(sim.message());
  REQUIRE(sim.ok());
  return r;
}

}  // namespace

TEST_CASE("simulate: a scenario with a bad key names the file and line", "[sim]") {
  TempDir dir;
  Scenario s;
  Status st = LoadScenario(WriteScenario(dir, "learners: 2", "chipz: 10\n"), {}, &s);
  CHECK_THAT(st.message(), Catch::Contains("sim.yaml:2:1") && Catch::Contains("unknown key 'chipz'"));
  st = LoadScenario(WriteScenario(dir, "learners: 2", "step_s: -1\n"), {}, &s);
  CHECK_THAT(st.message(), Catch::Contains("sim.yaml:2") && Catch::Contains("step_s must be > 0"));
  st = LoadScenario(WriteScenario(dir, "learners: 2", "step_s: fast\n"), {}, &s);
  CHECK_THAT(st.message(), Catch::Contains("step_s must be a number"));
  st = LoadScenario(dir.Write("norun.yaml", "chips: 8\n"), {}, &s);
  CHECK_THAT(st.message(), Catch::Contains("`run: RUN_CONFIG` is required"));
  st = LoadScenario(WriteScenario(dir, "learners: 2, quorum: 7", "chips: 8\n"), {}, &s);
  CHECK_THAT(st.message(), Catch::Contains("run.yaml") && Catch::Contains("quorum"));
  st = LoadScenario(dir.file("missing.yaml"), {}, &s);
  CHECK_THAT(st.message(), Catch::Contains("missing.yaml") && Catch::Contains("cannot be read"));
}

TEST_CASE("simulate: without failures decoupled learners keep the model moving", "[sim]") {
  TempDir dir;
  const std::string path = WriteScenario(dir, "learners: 4, fragments: 2, inner_steps: 10, quorum: 2",
                                         "chips: 64\nhours: 0.5\nchip_mtbf_h: 0\nstep_s: 0.1\nstep_jitter: 0\n");
  const SimResult r = Run(path, SimMode::kDecoupled);
  CHECK(r.failures == 0);
  CHECK(r.goodput.uptime == Approx(1.0));
  CHECK(r.goodput.goodput > 0.95);
  // Each fragment merges every H steps: 2 fragments x 1800 s / (10 x 0.1 s), all 4 in each.
  CHECK(r.merges == Approx(3600).epsilon(0.02));
  CHECK(r.contributors_mean == Approx(4).epsilon(0.02));
  REQUIRE(!r.staleness.empty());
  CHECK(r.staleness[0] == r.merges * 4);
}

TEST_CASE("simulate: the same seed gives the same run", "[sim]") {
  TempDir dir;
  const std::string path = WriteScenario(dir, "learners: 4, fragments: 2, inner_steps: 10, quorum: 1",
                                         "chips: 4000\nhours: 2\nchip_mtbf_h: 1000\nseed: 7\n");
  for (SimMode mode : {SimMode::kDdp, SimMode::kElasticDdp, SimMode::kDiloco, SimMode::kDecoupled}) {
    nlohmann::json a = SimResultToJson(Run(path, mode)), b = SimResultToJson(Run(path, mode));
    a.erase("runtime_s");
    b.erase("runtime_s");
    INFO(ToString(mode));
    CHECK(a == b);
    CHECK(a["failures"].get<int>() > 0);
  }
}

TEST_CASE("simulate: failures cost ddp more as the job grows and decoupled learners less", "[sim]") {
  TempDir dir;
  const std::string path = WriteScenario(dir, "learners: 8, fragments: 4, inner_steps: 50, quorum: 1",
                                         "chips: 100000\nhours: 12\nchip_mtbf_h: 50000\nstep_s: 1\n"
                                         "detect_s: 60\nrestart_s: 240\nrejoin_s: 60\ncheckpoint_every_s: 600\n");
  Scenario s;
  REQUIRE(LoadScenario(path, {}, &s).ok());
  double previous_ddp = 2;
  for (double chips : {25000.0, 100000.0, 400000.0}) {
    s.chips = chips;
    SimResult ddp, decoupled;
    REQUIRE(Simulate(s, SimMode::kDdp, &ddp).ok());
    REQUIRE(Simulate(s, SimMode::kDecoupled, &decoupled).ok());
    INFO(chips << " chips: ddp " << ddp.goodput.goodput << ", decoupled " << decoupled.goodput.goodput);
    CHECK(ddp.goodput.goodput < previous_ddp);
    CHECK(decoupled.goodput.goodput > ddp.goodput.goodput);
    previous_ddp = ddp.goodput.goodput;
  }
}

}  // namespace diloco
