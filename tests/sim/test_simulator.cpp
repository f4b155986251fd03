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

// fold: replay keeps the steps a learner made while its delta was in flight (the next test shows
// what the default fold, overwrite, does with them).
TEST_CASE("simulate: without failures decoupled learners keep the model moving", "[sim]") {
  TempDir dir;
  const std::string path = WriteScenario(dir, "learners: 4, fragments: 2, inner_steps: 10, quorum: 2, fold: replay",
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

// chip_mtbf_h: 0 means no failures in every mode (ddp drew its failures at an infinite rate and
// never ended).
TEST_CASE("simulate: without failures ddp and elastic ddp keep everything", "[sim]") {
  TempDir dir;
  const std::string path = WriteScenario(dir, "learners: 4", "chips: 64\nhours: 0.5\nchip_mtbf_h: 0\nstep_s: 0.1\n");
  for (SimMode mode : {SimMode::kDdp, SimMode::kElasticDdp}) {
    const SimResult r = Run(path, mode);
    CHECK(r.failures == 0);
    CHECK(r.goodput.goodput == Approx(1.0));
  }
}

// Two syncer shards merge the fragments one syncer merged: without failures or merge costs worth
// counting, the same merges, each shard host carrying a share of the traffic.
TEST_CASE("simulate: --syncers 2 merges what one syncer merges and halves a shard host's bytes", "[sim]") {
  TempDir dir;
  const std::string keys = "chips: 64\nhours: 0.2\nchip_mtbf_h: 0\nstep_s: 0.1\nstep_jitter: 0\nwan_window_s: 60\n";
  const SimResult one = Run(WriteScenario(dir, "learners: 4, fragments: 4, inner_steps: 8, quorum: 4", keys),
                            SimMode::kDecoupled);
  const SimResult two = Run(
      WriteScenario(dir, "learners: 4, fragments: 4, inner_steps: 8, quorum: 4, syncers: 2", keys), SimMode::kDecoupled);
  CHECK(one.syncers == 1);
  CHECK(two.syncers == 2);
  CHECK(two.merges == one.merges);
  CHECK(two.contributors_mean == one.contributors_mean);
  CHECK(two.goodput.goodput == Approx(one.goodput.goodput).epsilon(0.001));
  CHECK(one.peak_syncer_gbps > 0);
  // Each shard host carries half the fragments (the busiest minute: about half the bytes).
  CHECK(two.peak_syncer_gbps > 0.4 * one.peak_syncer_gbps);
  CHECK(two.peak_syncer_gbps < 0.6 * one.peak_syncer_gbps);
}

// The learners are the daemon's LearnerCore: its ledger folds every Global, and with the paper's
// fold (overwrite) the steps made while a delta was in flight are replaced by the global
// fragment, so they never reach the model. A Global comes back 2 x 50 ms (and a merge) after its
// delta left, i.e. after the next step (0.1 s) ended: it folds at the boundary after that, and 2
// of every 10 steps are lost. A copy of the rules that kept in-flight work would show ~1.0 here.
TEST_CASE("simulate: the real fold rule discards the steps made while a delta was in flight", "[sim]") {
  TempDir dir;
  const std::string keys = "chips: 64\nhours: 0.5\nchip_mtbf_h: 0\nstep_s: 0.1\nstep_jitter: 0\n";
  const SimResult overwrite =
      Run(WriteScenario(dir, "learners: 4, fragments: 2, inner_steps: 10, quorum: 4, fold: overwrite", keys),
          SimMode::kDecoupled);
  const SimResult replay =
      Run(WriteScenario(dir, "learners: 4, fragments: 2, inner_steps: 10, quorum: 4, fold: replay", keys),
          SimMode::kDecoupled);
  INFO("overwrite " << overwrite.goodput.goodput << ", replay " << replay.goodput.goodput);
  CHECK(overwrite.merges == replay.merges);  // the cadence does not depend on the fold
  CHECK(replay.goodput.goodput > 0.95);
  CHECK(overwrite.goodput.goodput == Approx(replay.goodput.goodput * 0.8).epsilon(0.03));
}

// diloco: the ledger blocks the step after a send until the fragment's Global is back (every
// H = 10 steps of 0.1 s, a round trip of 2 x 50 ms and the merge): the waits show as blocked
// time, about 0.1 s of every 1.1 s.
TEST_CASE("simulate: a lock-step learner blocked by the real ledger shows as blocked time", "[sim]") {
  TempDir dir;
  const SimResult r = Run(WriteScenario(dir, "learners: 2, inner_steps: 10",
                                        "chips: 2\nhours: 0.25\nchip_mtbf_h: 0\nstep_s: 0.1\nstep_jitter: 0\n"),
                          SimMode::kDiloco);
  INFO("blocked " << r.goodput.waste_blocked << ", goodput " << r.goodput.goodput);
  CHECK(r.goodput.waste_blocked == Approx(0.1 / 1.1).epsilon(0.15));
  CHECK(r.contributors_mean == Approx(2));
  CHECK(r.merges == Approx(900 / 1.1).epsilon(0.05));
}

// Learners killed and restarted 10 s later (88 steps of 0.113 s, 13 past a multiple of H = 25)
// rejoin at their own step. Out of the fleet's phase, each of their deltas came half a cycle after
// the fleet's, the rounds waited for them, and the merges bunched into gaps of more than twice the
// merge interval: uptime 0.965. Rejoining in phase (LearnerCore::StartStep), the merges keep their
// pace.
TEST_CASE("simulate: a restarted decoupled learner rejoins in the fleet's phase", "[sim]") {
  TempDir dir;
  dir.Write("corpus.txt", "not read by the simulator\n");
  dir.Write("run.yaml",
            "model: {n_layer: 2, n_embd: 64, n_head: 4, block_size: 64}\n"
            "data: {corpus: corpus.txt}\n"
            "train: {batch_size: 8, steps: 1000}\n"
            "sync: {learners: 4, fragments: 4, inner_steps: 25, quorum: 1, fold: replay,\n"
            "       grace: {gamma: 0.5, cap_ms: 20000}}\n"
            "chaos:\n"
            "  events:\n"
            "    - {at_s: 14, kill: {learner: 0, restart_after_s: 10}}\n"
            "    - {at_s: 21.5, kill: {learner: 3, restart_after_s: 10}}\n"
            "    - {at_s: 53.2, kill: {learner: 2, restart_after_s: 10}}\n"
            "    - {at_s: 58.4, kill: {learner: 1, restart_after_s: 10}}\n");
  const std::string path = dir.Write(
      "sim.yaml", "run: run.yaml\nchips: 4\nhours: 0\nchip_mtbf_h: 0\nstep_s: 0.113\nstep_jitter: 0.05\nheartbeat_s: 0.2\n");
  const SimResult r = Run(path, SimMode::kDecoupled);
  INFO("uptime " << r.goodput.uptime << ", goodput " << r.goodput.goodput << ", contributors " << r.contributors_mean);
  CHECK(r.failures == 4);
  CHECK(r.goodput.uptime == Approx(1.0));
  CHECK(r.contributors_mean > 3.5);
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
  // fold: replay. With overwrite, a learner that came back out of phase with the others loses
  // its progress on a fragment at each of their merges of it (the fold test above): failures
  // would then cost decoupled learners through the fold, not through the failures this is about.
  // 6 hours of 4 s steps: a few seconds on the cores (12 hours of 1 s steps took 11 s, 117 s
  // under the sanitizers) with failures at every size.
  const std::string path = WriteScenario(dir, "learners: 8, fragments: 4, inner_steps: 50, quorum: 1, fold: replay",
                                         "chips: 100000\nhours: 6\nchip_mtbf_h: 50000\nstep_s: 4\n"
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

TEST_CASE("simulate: whole-tensor fragments of a model with one huge tensor peak higher on the WAN", "[sim]") {
  TempDir dir;
  // wte (4096 x 64) is ~70% of the model: alone in fragment 0 it is ~3x the mean fragment.
  dir.Write("corpus.txt", "not read by the simulator\n");
  dir.Write("run.yaml",
            "model: {n_layer: 2, n_embd: 64, n_head: 4, block_size: 64, vocab_size: 4096}\n"
            "data: {corpus: corpus.txt, format: tokens}\n"
            "train: {batch_size: 8, steps: 200}\n"
            "sync: {learners: 2, fragments: 4, inner_steps: 8, quorum: 2, codec: {up: int4, down: int4}}\n");
  // No failures, no jitter, the peak over one fragment interval (8 x 1 s / 4): each window
  // holds one fragment's send per link, so peak / mean is the largest fragment / the mean (the
  // mean is over uplinks and downlinks: one codec both ways).
  const std::string path =
      dir.Write("sim.yaml", "run: run.yaml\nchips: 2\nhours: 0.25\nchip_mtbf_h: 0\nstep_s: 1\nstep_jitter: 0\n"
                            "wan_window_s: 0\n");
  const SimResult balanced = Run(path, SimMode::kDecoupled);
  Scenario s;
  REQUIRE(LoadScenario(path, {"balanced_fragments=false"}, &s).ok());
  CHECK_FALSE(s.balanced_fragments);
  SimResult whole;
  REQUIRE(Simulate(s, SimMode::kDecoupled, &whole).ok());
  INFO("balanced: peak " << balanced.peak_wan_gbps << " mean " << balanced.mean_wan_gbps << " imbalance "
                         << balanced.fragment_imbalance << "; whole tensors: peak " << whole.peak_wan_gbps
                         << " mean " << whole.mean_wan_gbps << " imbalance " << whole.fragment_imbalance);
  CHECK(balanced.wan_window_s == Approx(2.0));
  CHECK(balanced.fragments == 4);
  CHECK(balanced.fragment_imbalance <= 4.0 / 3.0);
  CHECK(whole.fragment_imbalance > 2.5);
  // The same bytes in all, only spread differently.
  CHECK(whole.mean_wan_gbps == Approx(balanced.mean_wan_gbps).epsilon(0.01));
  CHECK(whole.peak_wan_gbps > 2 * balanced.peak_wan_gbps);
  CHECK(balanced.peak_wan_gbps / balanced.mean_wan_gbps <= 4.0 / 3.0 * 1.05);
  CHECK(whole.peak_wan_gbps / whole.mean_wan_gbps == Approx(whole.fragment_imbalance).epsilon(0.05));
  // The goodput does not depend on how the model is cut.
  CHECK(whole.goodput.goodput == Approx(balanced.goodput.goodput).epsilon(0.02));
  const nlohmann::json j = SimResultToJson(whole);
  CHECK(j["balanced_fragments"] == false);
  CHECK(j["fragment_imbalance"].get<double>() == Approx(whole.fragment_imbalance));
}

TEST_CASE("simulate: topk_chunked payloads are sized by MaxEncodedBytes", "[sim]") {
  TempDir dir;
  dir.Write("corpus.txt", "not read by the simulator\n");
  auto run = [&](const std::string& codec) {
    dir.Write("run.yaml",
              "model: {n_layer: 2, n_embd: 64, n_head: 4, block_size: 64, vocab_size: 4096}\n"
              "data: {corpus: corpus.txt, format: tokens}\n"
              "train: {batch_size: 8, steps: 200}\n"
              "sync: {learners: 2, fragments: 4, inner_steps: 8, quorum: 2, codec: " + codec + "}\n");
    return Run(dir.Write("sim.yaml", "run: run.yaml\nchips: 2\nhours: 0.25\nchip_mtbf_h: 0\nstep_s: 1\n"
                                     "step_jitter: 0\nwan_window_s: 0\n"),
               SimMode::kDecoupled);
  };
  const SimResult int4 = run("{up: int4, down: int4}");
  const SimResult sparse = run("{up: topk_chunked, down: topk_chunked, chunk: 4096, keep: 64, bits: 2}");
  // The same sends, each of ~91K values: 0.0283 against 0.5625 bytes a value (+ 8 bytes a payload).
  INFO("int4 mean " << int4.mean_wan_gbps << ", topk_chunked mean " << sparse.mean_wan_gbps);
  CHECK(sparse.mean_wan_gbps / int4.mean_wan_gbps == Approx((116.0 / 4096) / (0.5 + 4.0 / 64)).epsilon(0.03));
}

TEST_CASE("simulate: the merge throughput can come from a bench syncer output", "[sim]") {
  TempDir dir;
  const std::string plain = WriteScenario(dir, "learners: 2", "chips: 8\n");
  Scenario s;
  REQUIRE(LoadScenario(plain, {}, &s).ok());
  CHECK(s.merge_gbps == 10);
  CHECK(s.merge_gbps_source == "default");
  REQUIRE(LoadScenario(WriteScenario(dir, "learners: 2", "merge_gbps: 4\n"), {}, &s).ok());
  CHECK(s.merge_gbps_source == "scenario");

  dir.Write("bench.json", R"({"merge_GBps":2.5,"copy_GBps":9.0,"peak_rss_mb":120})" "\n");
  const std::string path = WriteScenario(dir, "learners: 2, fragments: 2, inner_steps: 10",
                                         "chips: 8\nhours: 0.1\nchip_mtbf_h: 0\nmerge_bench: bench.json\n");
  REQUIRE(LoadScenario(path, {}, &s).ok());
  CHECK(s.merge_gbps == 2.5);
  CHECK(s.merge_gbps_source == dir.file("bench.json"));
  SimResult r;
  REQUIRE(Simulate(s, SimMode::kDecoupled, &r).ok());
  const nlohmann::json j = SimResultToJson(r);
  CHECK(j["merge_gbps"].get<double>() == 2.5);
  CHECK(j["merge_gbps_source"] == dir.file("bench.json"));
  // The command line's merge_bench or merge_gbps replaces the file's.
  dir.Write("other.json", R"({"merge_GBps":7})");
  REQUIRE(LoadScenario(plain, {"merge_bench=" + dir.file("other.json")}, &s).ok());
  CHECK(s.merge_gbps == 7);
  CHECK(s.merge_gbps_source == dir.file("other.json"));
  REQUIRE(LoadScenario(path, {"merge_gbps=3"}, &s).ok());
  CHECK(s.merge_gbps == 3);
  CHECK(s.merge_gbps_source == "--set");

  // Bad files: each error names the file, and the field where it is the problem.
  dir.Write("nofield.json", R"({"copy_GBps":9.0})");
  dir.Write("zero.json", R"({"merge_GBps":0})");
  dir.Write("text.json", R"({"merge_GBps":"fast"})");
  dir.Write("garbage.json", "syncer: 1000 params, merge 2.5 GB/s\n");
  struct Bad {
    std::string file, says;
  };
  for (const Bad& bad : {Bad{"nofield.json", "has no field merge_GBps"},
                         Bad{"zero.json", "merge_GBps must be a number > 0"},
                         Bad{"text.json", "merge_GBps must be a number > 0"},
                         Bad{"garbage.json", "not one JSON object"}, Bad{"missing.json", "cannot be read"}}) {
    INFO(bad.file);
    const Status st = LoadScenario(WriteScenario(dir, "learners: 2", "merge_bench: " + bad.file + "\n"), {}, &s);
    CHECK_THAT(st.message(), Catch::Contains("sim.yaml:2") && Catch::Contains(dir.file(bad.file)) &&
                                 Catch::Contains(bad.says));
  }
  Status st = LoadScenario(WriteScenario(dir, "learners: 2", "merge_gbps: 4\nmerge_bench: bench.json\n"), {}, &s);
  CHECK_THAT(st.message(), Catch::Contains("merge_gbps or merge_bench, not both"));
  WriteScenario(dir, "learners: 2", "chips: 8\n");  // plain again
  st = LoadScenario(plain, {"merge_bench=" + dir.file("zero.json")}, &s);
  CHECK_THAT(st.message(), Catch::Contains("--set merge_bench=") && Catch::Contains("merge_GBps must be"));
  st = LoadScenario(plain, {"balanced_fragments=maybe"}, &s);
  CHECK_THAT(st.message(), Catch::Contains("balanced_fragments must be true or false"));
}

TEST_CASE("simulate: dilococtl simulate --merge-bench takes a bench syncer --json output", "[sim]") {
  TempDir dir;
  const std::string path = WriteScenario(dir, "learners: 2, fragments: 2, inner_steps: 10",
                                         "chips: 8\nhours: 0.1\nchip_mtbf_h: 0\n");
  REQUIRE(Shell(dir.path(),
                "(" + kDilococtl +
                    " bench syncer --params 100000 --learners 2 --fragments 2 --rounds 2 --json > bench.json)",
                "bench") == 0);
  const int rc = Shell(dir.path(), kDilococtl + " simulate " + path + " --merge-bench bench.json --json", "sim");
  INFO(ReadFile(dir.file("sim.err")));
  REQUIRE(rc == 0);
  const nlohmann::json bench = nlohmann::json::parse(ReadFile(dir.file("bench.json")));
  const nlohmann::json row = nlohmann::json::parse(ReadFile(dir.file("sim.out")));
  CHECK(row["merge_gbps"].get<double>() == Approx(bench["merge_GBps"].get<double>()));
  CHECK(row["merge_gbps_source"] == "bench.json");
  // A bad file is a bad option (exit 2) that names it.
  dir.Write("empty.json", "{}");
  CHECK(Shell(dir.path(), kDilococtl + " simulate " + path + " --merge-bench empty.json", "bad") == 2);
  CHECK_THAT(ReadFile(dir.file("bad.err")), Catch::Contains("empty.json") && Catch::Contains("merge_GBps"));
}

}  // namespace diloco
