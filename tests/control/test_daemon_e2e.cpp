// End-to-end: real dilocod processes on loopback (LocalCluster: free ports, CURVE keys made on
// the fly), driven by the real dilococtl binary and the control protocol. A tiny model keeps each
// case to seconds; every wait is for a condition, with a generous deadline.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "daemon/config/daemon_config.h"
#include "daemon/control/client.h"
#include "daemon/control/job_store.h"
#include "daemon/control/local_cluster.h"
#include "daemon/export/export_run.h"
#include "daemon/export/safetensors.h"
#include "daemon/net/curve.h"
#include "daemon/sync/global_state.h"
#include "daemon/sync/protocol.h"
#include "daemon/train/trainer.h"
#include "kernels/gpt.h"
#include "tests/control/daemon_testing.h"
#include "tests/temp_dir.h"

namespace diloco {
using namespace testing;

TEST_CASE("three daemons run a submitted job, status shows both learners, SIGTERM exits cleanly", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir, /*metrics=*/true);
  const std::string job = Submit(dir, *c, 1500);

  // `dilococtl status --json` (through site-a, which asks the other sites) shows both learners
  // progressing while the job runs.
  const auto deadline = Clock::now() + std::chrono::seconds(40);
  bool seen_both = false;
  while (!seen_both && Clock::now() < deadline) {
    const CtlResult r = Ctl(dir, "status " + job + " --json --socket '" + c->SocketPath("site-a") + "'");
    REQUIRE(r.exit_code == 0);
    const nlohmann::json s = nlohmann::json::parse(r.out);
    if (s["state"] != "running") break;
    seen_both = LearnerStep(s, 0) > 0 && LearnerStep(s, 1) > 0 && s["learners"][0]["site"] == "site-a" &&
                s["learners"][1]["site"] == "site-b" && s["learners"][0].contains("progress") &&
                s["learners"][1].contains("progress");
    if (seen_both) {
      CHECK(s["syncer"]["site"] == "site-s");
      CHECK(s["learners"][1]["progress"].contains("tokens_per_s"));
      CHECK(s["learners"][1]["progress"].contains("last_fragment_sent"));
    }
  }
  CHECK(seen_both);
  // Prometheus text on each site's metrics port.
  std::string learner_metrics, syncer_metrics;
  for (int i = 0; i < 100 && (learner_metrics.find("dilocod_learner_steps{") == std::string::npos ||
                              syncer_metrics.find("dilocod_syncer_merges_total{") == std::string::npos ||
                              syncer_metrics.find("dilocod_job_goodput_ratio{") == std::string::npos); i++) {
    learner_metrics = HttpGetMetrics(c->MetricsPort("site-b"));
    syncer_metrics = HttpGetMetrics(c->MetricsPort("site-s"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK_THAT(learner_metrics, Catch::Contains("dilocod_learner_steps{job=\"" + job + "\",learner=\"1\"}"));
  CHECK_THAT(syncer_metrics, Catch::Contains("# TYPE dilocod_syncer_merges_total counter"));
  CHECK_THAT(syncer_metrics, Catch::Contains("dilocod_jobs{state=\"running\"}"));
  CHECK_THAT(syncer_metrics, Catch::Contains("dilocod_job_goodput_ratio{job=\"" + job + "\",shard=\"0\"}") &&
                                 Catch::Contains("dilocod_job_uptime_ratio{job=\"" + job + "\",shard=\"0\"}") &&
                                 Catch::Contains("dilocod_job_waste_ratio{job=\"" + job + "\",shard=\"0\",cause=\"down\"}"));

  const nlohmann::json s = WaitStatus(*c, "site-b", job, Completed, 60, "the job to complete");
  const nlohmann::json& sum = s["summary"];
  CHECK(sum["learners"] == 2);
  CHECK(sum["steps"] == 3000);
  CHECK(sum["outer_steps"].get<int>() > 0);
  CHECK(sum["final_val_loss"].get<double>() < sum["initial_val_loss"].get<double>());
  CHECK(sum["final_val_batches"].get<int>() > 0);  // how many batches final_val_loss took
  CHECK(sum["goodput"].get<double>() > 0);
  CHECK(sum["goodput"].get<double>() <= 1);
  CHECK(sum["waste"]["down"] == 0);  // nobody failed
  // The summary a local run of several learners writes, key for key (one summary builder).
  TrainSummary several;
  several.learners = 2;
  several.goodput = GoodputReport{};
  const nlohmann::json local_keys = TrainSummaryObject(several);
  for (const auto& [key, value] : local_keys.items()) {
    INFO(key);
    CHECK(sum.contains(key));
  }
  CHECK(fs::exists(sum["checkpoint"].get<std::string>()));
  CHECK(fs::exists(s["run_dir"].get<std::string>() + "/global_state.bin"));
  {
    // The syncer's site writes the job's run-level lines as a local run does (one metrics
    // layout): its start, each learner's end, the merged model's evaluation and the summary.
    std::ifstream in(s["run_dir"].get<std::string>() + "/metrics.jsonl");
    std::vector<std::string> events;
    nlohmann::json last_summary;
    std::set<int> done;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      events.push_back(j.value("event", ""));
      if (events.back() == "learner_done") done.insert(j.value("learner", -1));
      if (events.back() == "summary") last_summary = j;
    }
    REQUIRE(events.size() == 5);
    CHECK(events.front() == "start");
    CHECK(done == std::set<int>{0, 1});
    CHECK(events[3] == "eval");
    CHECK(events[4] == "summary");
    CHECK(last_summary["tokens"] == sum["tokens"]);
    CHECK(last_summary["steps"] == sum["steps"]);
    CHECK(last_summary["outer_steps"] == sum["outer_steps"]);
    CHECK(last_summary["final_val_loss"] == sum["final_val_loss"]);
    CHECK(last_summary["initial_val_loss"] == sum["initial_val_loss"]);
  }
  // The merged model exports as safetensors whose tensors match the model's table.
  const CtlResult ex = Ctl(dir, "export " + job + " --format safetensors -o '" + dir.file("model.safetensors") +
                                    "' --json --socket '" + c->SocketPath("site-a") + "'");
  INFO(ex.err);
  REQUIRE(ex.exit_code == 0);
  SafetensorsIndex index;
  REQUIRE(ReadSafetensorsIndex(dir.file("model.safetensors"), &index).ok());
  GptConfig gc;
  gc.n_layer = 2;
  gc.n_embd = 32;
  gc.n_head = 4;
  gc.block_size = 32;
  const TensorTable table = ExportTensorTable(gc, ExportLayout::kNanoGpt);  // nanoGPT's names
  CHECK(CheckSafetensorsMatchesTable(index, table).ok());
  uint64_t data_bytes = 0;
  for (const SafetensorsEntry& e : index.entries) data_bytes += e.end - e.begin;
  CHECK(data_bytes == table.total_numel() * sizeof(float));
  CHECK(index.data_offset + data_bytes == index.file_bytes);
  CHECK(index.metadata["job"] == job);
  CHECK(index.metadata["merges"] == std::to_string(sum["outer_steps"].get<uint64_t>()));
  CHECK(index.metadata["training_steps"] == std::to_string(sum["steps"].get<uint64_t>()));  // from the job's status
  CHECK(nlohmann::json::parse(ex.out)["num_params"] == gpt_tensor_table(gc).total_numel());
  // Every site recorded the job as completed.
  const CtlResult list = Ctl(dir, "list --json --socket '" + c->SocketPath("site-s") + "'");
  REQUIRE(list.exit_code == 0);
  CHECK(nlohmann::json::parse(list.out).at(0)["state"] == "completed");
  const CtlResult logs = Ctl(dir, "logs " + job + " --socket '" + c->SocketPath("site-a") + "'");
  CHECK(logs.exit_code == 0);
  CHECK_THAT(logs.out, Catch::Contains("[site-s] syncer completed") && Catch::Contains("[site-b] learner-1 completed"));

  // SIGTERM: each daemon exits 0 well within 10 s.
  for (const std::string& site : c->sites()) {
    const auto t0 = Clock::now();
    int code = -1;
    CHECK(c->Stop(site, 10000, &code).ok());
    CHECK(code == 0);
    CHECK(Clock::now() - t0 < std::chrono::seconds(10));
  }
}

TEST_CASE("learners with train.ranks 2 train as local rings, and a job asking for GPUs of cpu sites is refused",
          "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string sock = " --socket '" + c->SocketPath("site-a") + "'";
  std::string yaml = JobYaml(300);
  yaml.replace(yaml.find("log_every: 50}"), 14, "log_every: 50, ranks: 2}");
  CtlResult r = Ctl(dir, "submit '" + dir.Write("ranks.yaml", yaml) + "'" + sock);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string job = r.out.substr(0, r.out.find('\n'));
  // Status shows each learner's ring while it trains.
  WaitStatus(*c, "site-a", job,
             [](const nlohmann::json& s) {
               for (const auto& l : s["learners"])
                 if (!l.contains("progress") || l["progress"].value("ranks", 0) != 2) return false;
               return true;
             },
             60, "both learners reporting 2 ranks");
  r = Ctl(dir, "status " + job + sock);
  CHECK_THAT(r.out, Catch::Contains("cpu x2"));
  const nlohmann::json done = WaitStatus(*c, "site-a", job, Completed, 120, "the job to complete");
  for (const auto& l : done["learners"]) CHECK(l["result"].value("steps", 0L) == 300);

  // train.device cuda on sites whose daemon config lists only the cpu: refused at submit, naming
  // the site and what it has; nothing is left running.
  std::string gpu = JobYaml(100);
  gpu.replace(gpu.find("log_every: 50}"), 14, "log_every: 50, device: cuda}");
  r = Ctl(dir, "submit '" + dir.Write("gpu.yaml", gpu) + "'" + sock);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.err, Catch::Contains("site-") && Catch::Contains("has devices cpu"));
  r = Ctl(dir, "list --json" + sock);
  for (const auto& j : nlohmann::json::parse(r.out)) CHECK(j.value("state", "") != "running");
}

TEST_CASE("a learner daemon killed with -9 and started again rejoins and the job completes", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string job = Submit(dir, *c, 2500);
  WaitStatus(*c, "site-a", job, [](const nlohmann::json& s) { return LearnerStep(s, 1) >= 300; }, 40,
             "learner-1 to reach step 300");
  // It rewrites its step file about once a second: kill it once the file holds a step.
  const std::string run_b = c->StateDir("site-b") + "/jobs/" + job + "/run";
  for (int i = 0; i < 200 && std::atol(ReadFile(run_b + "/learner-1.step").c_str()) <= 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c->Kill("site-b", SIGKILL);
  // The step learner-1 had recorded when it died.
  const long recorded = std::atol(ReadFile(run_b + "/learner-1.step").c_str());
  CHECK(recorded > 0);
  const int64_t restarted_ms = UnixMs();
  REQUIRE(c->Start("site-b").ok());

  const nlohmann::json s = WaitStatus(*c, "site-a", job, Completed, 60, "the job to complete after the restart");
  // learner-1 continued from its recorded step (not from 0) and joined from the syncer's snapshot.
  const nlohmann::json& r1 = s["learners"][1]["result"];
  CHECK(r1["start_step"].get<long>() == recorded);
  CHECK(r1["snapshots_installed"].get<int>() >= 1);
  CHECK(r1["steps"] == 2500);
  // Its deltas were merged again after the restart (the syncer's event log).
  int merged_after = 0;
  for (const auto& m : Merges(s["run_dir"])) merged_after += m["time_ms"].get<int64_t>() > restarted_ms && MergedFrom(m, 1);
  CHECK(merged_after > 0);
  CHECK_THAT(ReadFile(c->StateDir("site-b") + "/jobs/" + job + "/job.log"), Catch::Contains("resumed roles: learner-1"));
}

// The syncer's site went down after its syncer ended but before the job's summary was written
// (it waits for the learners' results): started again, it settles the job (completed) and
// writes the summary then, instead of leaving the job running forever.
TEST_CASE("a syncer site restarted between its syncer's end and the summary settles the job", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string job = Submit(dir, *c, 300);
  WaitStatus(*c, "site-a", job, Completed, 60, "the job to complete");
  c->Kill("site-s", SIGKILL);
  // As it was just before the summary: the job running here, its syncer completed, metrics.jsonl
  // holding only the start line.
  JobStore store(c->StateDir("site-s"));
  JobRecord rec;
  REQUIRE(store.Load(job, &rec).ok());
  REQUIRE(rec.roles[kSyncerName].state == JobState::kCompleted);
  rec.state = JobState::kRunning;
  REQUIRE(store.Save(rec).ok());
  const std::string metrics = c->StateDir("site-s") + "/jobs/" + job + "/run/metrics.jsonl";
  const std::string lines = ReadFile(metrics);
  { std::ofstream(metrics, std::ios::trunc) << lines.substr(0, lines.find('\n') + 1); }
  REQUIRE(c->Start("site-s").ok());

  const nlohmann::json s = WaitStatus(*c, "site-a", job, Completed, 30, "the job to settle after the restart");
  const std::string after = ReadFile(metrics);
  CHECK_THAT(after, Catch::Contains("\"event\":\"learner_done\"") && Catch::Contains("\"event\":\"summary\""));
  CHECK(s["summary"]["steps"] == 600);
  CHECK_THAT(ReadFile(c->StateDir("site-s") + "/jobs/" + job + "/job.log"), Catch::Contains("settled now"));
}

// Every published version is in the update log before it goes out, so a syncer killed with -9
// comes back at exactly its last published versions, however old its checkpoint (here: none
// after the start), and never issues a version number twice.
TEST_CASE("the syncer daemon killed with -9 resumes from its checkpoint and versions never go back", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir);
  // Long enough that the learners are still training when the syncer is back: without a
  // syncer they run at full speed (nothing to send once every fragment has a delta in flight).
  const std::string job = Submit(dir, *c, 8000, /*checkpoint_every=*/100000);
  const nlohmann::json before = WaitStatus(
      *c, "site-a", job,
      [](const nlohmann::json& s) {
        uint64_t sum = 0;
        for (uint64_t v : Versions(s)) sum += v;
        return sum >= 8;
      },
      40, "8 merges");
  REQUIRE(LearnerStep(before, 0) < 4000);
  REQUIRE(LearnerStep(before, 1) < 4000);
  c->Kill("site-s", SIGKILL);
  GlobalState checkpoint;
  const std::string run_dir = before["run_dir"];
  REQUIRE(LoadGlobalState(run_dir + "/global_state.bin", &checkpoint).ok());

  // The learners keep training while their syncer is gone.
  const long a0 = LearnerStep(before, 0), b0 = LearnerStep(before, 1);
  WaitStatus(*c, "site-a", job,
             [&](const nlohmann::json& s) { return LearnerStep(s, 0) > a0 + 50 && LearnerStep(s, 1) > b0 + 50; }, 30,
             "the learners to train on without the syncer");
  const int64_t restarted_ms = UnixMs();
  REQUIRE(c->Start("site-s").ok());

  // From its checkpoint on, versions only go up.
  std::vector<uint64_t> last(checkpoint.fragments.size());
  for (size_t p = 0; p < last.size(); p++) last[p] = checkpoint.fragments[p].version;
  bool went_back = false;
  const nlohmann::json done = WaitStatus(
      *c, "site-a", job,
      [&](const nlohmann::json& s) {
        const std::vector<uint64_t> v = Versions(s);
        for (size_t p = 0; p < v.size() && p < last.size(); p++) {
          went_back |= v[p] < last[p];
          last[p] = std::max(last[p], v[p]);
        }
        return Completed(s);
      },
      // The learners still have most of their 8000 steps to go: about a minute of training
      // under the sanitizers on 2 shared cores, so leave room beyond that.
      150, "the job to complete after the syncer's restart");
  CHECK_FALSE(went_back);
  const auto final_versions = done["summary"]["versions"].get<std::vector<uint64_t>>();
  for (size_t p = 0; p < final_versions.size(); p++) CHECK(final_versions[p] >= checkpoint.fragments[p].version);
  // It merged again after the restart, with versions above the checkpoint's.
  int merges_after = 0;
  for (const auto& m : Merges(run_dir)) {
    if (m["time_ms"].get<int64_t>() <= restarted_ms) continue;
    merges_after++;
    CHECK(m["version"].get<uint64_t>() > checkpoint.fragments[m["fragment"].get<int>()].version);
  }
  INFO("site-s log:\n" << TailFile(c->LogPath("site-s"), 30) << "site-a log:\n" << TailFile(c->LogPath("site-a"), 30));
  CHECK(merges_after > 0);
  CHECK_THAT(ReadFile(c->StateDir("site-s") + "/jobs/" + job + "/job.log"), Catch::Contains("resumed roles: syncer"));
  // No version was issued twice, and each fragment's versions only go up in the merge tape.
  std::map<int, uint64_t> tape_last;
  for (const auto& m : Merges(run_dir)) {
    const int p = m["fragment"].get<int>();
    const uint64_t v = m["version"].get<uint64_t>();
    INFO("fragment " << p << " version " << v << " after " << tape_last[p]);
    CHECK(v > tape_last[p]);
    tape_last[p] = std::max(tape_last[p], v);
  }
  CHECK_THAT(TailFile(c->LogPath("site-s"), 200), Catch::Contains("replayed"));
}

// dilococtl chaos against a daemon job: a learner's roles killed and restarted on its site, a
// learner slowed and partitioned through its emulated link, each undone on time, and the job
// completes with the killed learner resumed from its recorded step.
TEST_CASE("dilococtl chaos kills, slows and partitions a daemon job's learners and it completes", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir, /*metrics=*/false, /*chaos=*/true);
  // Paced (each step stretched 2x) so the learners are still training through the faults, and
  // the job still completes within the waits below under ASan on a busy machine.
  // Its own chaos: section (played from site-s, sent to site-b) cuts learner-1 off once it
  // reaches step 1800: well after the kill below, which lands a few hundred steps past 200 (at
  // step 600 the partition could fire while learner-1 was down, and site-s would log "no running
  // role matches" instead), and 1200 steps before the end, so the heal comes while it trains.
  const std::string yaml = dir.Write("paced.yaml", JobYaml(3000) +
                                                        "learners: [{slowdown: 2}, {slowdown: 2}]\n"
                                                        "chaos: {events: [{at_step: 1800, partition: {learner: 1, duration_s: 1}}]}\n");
  const std::string sock = " --socket '" + c->SocketPath("site-a") + "'";
  CtlResult r = Ctl(dir, "submit '" + yaml + "'" + sock);
  REQUIRE(r.exit_code == 0);
  const std::string job = r.out.substr(0, r.out.find('\n'));
  WaitStatus(*c, "site-a", job, [](const nlohmann::json& s) { return LearnerStep(s, 1) >= 200; }, 40,
             "learner-1 to reach step 200");

  // Mistakes are refused before anything happens.
  r = Ctl(dir, "chaos " + job + " kill site-z" + sock);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("no role on site 'site-z'"));
  r = Ctl(dir, "chaos " + job + " kill site-a --syncer" + sock);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("no running role matches"));
  r = Ctl(dir, "chaos " + job + " drop site-a --prob 2" + sock);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("probability in [0, 1]"));

  // site-b's learner dies (through site-a's daemon, forwarded) and comes back 2 s later.
  r = Ctl(dir, "chaos " + job + " kill site-b --restart-after 2" + sock);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("kill every role of the job on site-b (restart after 2 s)"));
  WaitStatus(*c, "site-a", job, [](const nlohmann::json& s) { return s["learners"][1].value("state", "") == "down"; }, 10,
             "learner-1 to show as down");
  WaitStatus(*c, "site-a", job,
             [](const nlohmann::json& s) { return s["learners"][1].value("state", "") == "running" && s["learners"][1].contains("progress"); },
             20, "learner-1 to run again");
  // site-a's learner: 3x slower for 2 s, then cut off for 2 s.
  r = Ctl(dir, "chaos " + job + " slow site-a --factor 20 --duration 2" + sock);
  CHECK(r.exit_code == 0);
  r = Ctl(dir, "chaos " + job + " partition site-a --learner 0 --duration 2" + sock);
  CHECK(r.exit_code == 0);
  const int64_t healed_ms = UnixMs() + 2000;

  // The status screen shows goodput while the job runs.
  r = Ctl(dir, "status " + job + sock);
  CHECK_THAT(r.out, Catch::Contains("goodput ") && Catch::Contains("uptime "));
  const nlohmann::json s = WaitStatus(*c, "site-a", job, Completed, 90, "the job to complete after the faults");
  // learner-1's outage is down waste in the syncer's accounting; nothing was dropped.
  INFO(s["summary"].dump());
  CHECK(s["summary"]["waste"]["down"].get<double>() > 0);
  CHECK(s["summary"]["goodput"].get<double>() > 0);
  CHECK(s["summary"]["goodput"].get<double>() < 1);
  const nlohmann::json& r1 = s["learners"][1]["result"];
  CHECK(r1["start_step"].get<long>() > 0);
  CHECK(r1["snapshots_installed"].get<int>() >= 1);
  CHECK(r1["steps"] == 3000);
  CHECK(s["learners"][0]["result"]["steps"] == 3000);
  const std::string log_a = ReadFile(c->StateDir("site-a") + "/jobs/" + job + "/job.log");
  const std::string log_b = ReadFile(c->StateDir("site-b") + "/jobs/" + job + "/job.log");
  CHECK_THAT(log_b, Catch::Contains("chaos: kill every role of the job on site-b") &&
                        Catch::Contains("chaos: restart every role of the job on site-b") &&
                        Catch::Contains("resumed roles: learner-1") &&
                        Catch::Contains("chaos: partition learner-1 on site-b") && Catch::Contains("chaos: heal learner-1 on site-b"));
  CHECK_THAT(ReadFile(c->StateDir("site-s") + "/jobs/" + job + "/job.log"), Catch::Contains("chaos timeline"));
  // The timeline's actions are lines of the job's metrics.jsonl at site-s, as in a local run.
  const std::string run_lines = ReadFile(s["run_dir"].get<std::string>() + "/metrics.jsonl");
  CHECK_THAT(run_lines, Catch::Contains("\"event\":\"chaos\"") && Catch::Contains("\"action\":\"partition_start\"") &&
                            Catch::Contains("\"event\":\"summary\""));
  CHECK_THAT(log_a, Catch::Contains("chaos: slow every learner of the job on site-a (x20) for 2 s") &&
                        Catch::Contains("chaos: slow every learner of the job on site-a (back to the config's pace)") &&
                        Catch::Contains("chaos: partition learner-0 on site-a for 2 s") &&
                        Catch::Contains("chaos: heal learner-0 on site-a"));
  // learner-0's deltas were merged after its link healed.
  int merged_after = 0;
  for (const auto& m : Merges(s["run_dir"])) merged_after += m["time_ms"].get<int64_t>() > healed_ms && MergedFrom(m, 0);
  CHECK(merged_after > 0);
}

TEST_CASE("dilococtl stop ends a job on every site", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string job = Submit(dir, *c, 100000);
  WaitStatus(*c, "site-a", job, [](const nlohmann::json& s) { return LearnerStep(s, 0) > 20 && LearnerStep(s, 1) > 20; },
             40, "both learners to train");
  const CtlResult r = Ctl(dir, "stop " + job + " --socket '" + c->SocketPath("site-b") + "'");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json s = WaitStatus(*c, "site-a", job,
                                      [](const nlohmann::json& s) {
                                        return s["state"] == "stopped" && s["learners"][0]["state"] == "stopped" &&
                                               s["learners"][1]["state"] == "stopped";
                                      },
                                      30, "the job to stop everywhere");
  CHECK(s["syncer"]["state"] == "stopped");
  CHECK(LearnerStep(s, 0) < 100000);
  // Stopping again is harmless.
  CHECK(Ctl(dir, "stop " + job + " --socket '" + c->SocketPath("site-a") + "'").exit_code == 0);
}

TEST_CASE("bad input is refused clearly: config, job id, unknown peer key, second daemon", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string sock = " --socket '" + c->SocketPath("site-a") + "'";

  // A run config with an unknown key: refused with file:line, exit 2, nothing submitted.
  const std::string bad = dir.Write("bad.yaml", JobYaml(10) + "trian: {steps: 5}\n");
  CtlResult r = Ctl(dir, "submit '" + bad + "'" + sock);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("bad.yaml:7:1") && Catch::Contains("trian"));
  // A config without a placement is for local mode only.
  const std::string local = dir.Write("local.yaml", "data: {corpus: x.txt}\n");
  r = Ctl(dir, "submit '" + local + "'" + sock);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("placement"));
  // A placement naming a site the daemon does not know.
  std::string unknown_site = JobYaml(10);
  unknown_site.replace(unknown_site.find("site-b]"), 6, "site-z");
  r = Ctl(dir, "submit '" + dir.Write("z.yaml", unknown_site) + "'" + sock);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("site-z"));
  // A chaos: section on sites that do not allow chaos.
  r = Ctl(dir, "submit '" + dir.Write("chaos.yaml", JobYaml(10) + "chaos: {events: [{at_s: 1, kill: {learner: 0}}]}\n") +
                   "'" + sock);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("chaos: false"));
  r = Ctl(dir, "list --json" + sock);
  CHECK(nlohmann::json::parse(r.out).empty());

  // An unknown job id.
  r = Ctl(dir, "status no-such-job" + sock);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("unknown job id 'no-such-job'"));
  r = Ctl(dir, "stop no-such-job" + sock);
  CHECK(r.exit_code == 2);
  // No daemon at all.
  r = Ctl(dir, "list --socket '" + dir.file("nothing.sock") + "'");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("is the daemon running"));

  // A peer whose key is not on site-s's allowlist gets no answer, and site-s logs the refusal.
  DaemonConfig site_s;
  REQUIRE(LoadDaemonConfig(c->ConfigPath("site-s"), &site_s).ok());
  net::CurveKeyPair server, stranger;
  REQUIRE(net::LoadCurveKeyPair(c->SiteDir("site-s") + "/keys", &server).ok());
  REQUIRE(net::GenerateCurveKeyPair(&stranger).ok());
  std::unique_ptr<net::NetContext> context;
  REQUIRE(net::NetContext::Create({}, &context).ok());
  ControlTarget target;
  target.endpoint = site_s.listen.control;
  target.sender = "site-a";
  target.timeout_ms = 1500;
  target.curve = net::CurveOptions{stranger.public_z85, stranger.secret_z85, false, "dilocod", server.public_z85};
  ControlArgs reply;
  const Status st = CallControl(*context, target, "peer_status", "x", {}, &reply);
  CHECK_FALSE(st.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_THAT(TailFile(c->LogPath("site-s"), 20), Catch::Contains("refused") && Catch::Contains(stranger.public_z85));

  // A second daemon on the same state directory refuses to start (the lock file).
  const std::string cmd = kBin + "dilocod --config '" + c->ConfigPath("site-a") + "' 2> '" + dir.file("second.err") + "'";
  const int rc = std::system(cmd.c_str());
  CHECK(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 1);
  CHECK_THAT(ReadFile(dir.file("second.err")), Catch::Contains("dilocod.lock"));
  CHECK(c->Running("site-a"));
  // ... and --check-config only validates.
  CHECK(std::system((kBin + "dilocod --check-config --config '" + c->ConfigPath("site-a") + "' > /dev/null").c_str()) == 0);
}

TEST_CASE("dilocod tells systemd READY=1 once bound, STATUS, and STOPPING=1 on SIGTERM", "[e2e]") {
  testing::TempDir dir;
  LocalClusterOptions o;
  o.dir = dir.file("cluster");
  o.sites = {"site-x"};
  o.dilocod_path = kBin + "dilocod";
  std::unique_ptr<LocalCluster> c;
  REQUIRE(LocalCluster::Create(o, &c).ok());
  // Play systemd: a datagram socket at $NOTIFY_SOCKET.
  const std::string path = dir.file("notify.sock");
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  timeval tv = {20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string config = c->ConfigPath("site-x"), log = dir.file("x.log");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, STDERR_FILENO);
    ::execl(o.dilocod_path.c_str(), o.dilocod_path.c_str(), "--config", config.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  auto next = [&] {
    char buf[512];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, n) : std::string("(nothing)");
  };
  CHECK(next() == "READY=1");
  // Ready means bound: the control socket answers.
  ControlArgs reply;
  CHECK(CallDaemon(c->SocketPath("site-x"), "ping", kNoJob, {}, &reply).ok());
  CHECK_THAT(next(), Catch::StartsWith("STATUS=0 running"));
  ::kill(pid, SIGTERM);
  CHECK(next() == "STOPPING=1");
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  ::close(fd);
}

}  // namespace diloco
