// dilococtl demo: a local cluster of 3 dilocod processes on loopback (learner sites site-a and
// site-b, syncer site site-s; CURVE with keys made on the fly), the job configs/demo.yaml
// submitted to site-a, progress until it completes, the summary and a sample from the merged
// model, then the cluster shut down with SIGTERM. Everything stays under the demo directory.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "apps/dilococtl/job_commands.h"
#include "daemon/config/run_config.h"
#include "daemon/control/client.h"
#include "daemon/control/local_cluster.h"
#include "daemon/train/checkpoint.h"
#include "daemon/util/atomic_file.h"
#include "daemon/train/generate.h"
#include "kernels/gpt.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) { g_interrupted = true; }

std::string SelfDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

int Failed(LocalCluster* cluster, const std::string& message) {
  std::fprintf(stderr, "dilococtl demo: %s\n", message.c_str());
  if (cluster) {
    for (const std::string& site : cluster->sites())
      std::fprintf(stderr, "--- the end of %s ---\n%s", cluster->LogPath(site).c_str(),
                   TailFile(cluster->LogPath(site), 8).c_str());
    (void)cluster->StopAll();
  }
  return 1;
}

}  // namespace

int RunClusterDemoCommand(const ClusterDemoCommand& cmd) {
  const auto start = Clock::now();
  const std::string config_path =
      cmd.config_path.empty() ? std::string(DILOCO_SOURCE_DIR) + "/configs/demo.yaml" : cmd.config_path;
  RunConfig cfg;
  if (Status st = LoadRunConfig(config_path, cmd.overrides, &cfg); !st.ok()) {
    std::fprintf(stderr, "dilococtl demo: %s\n", st.message().c_str());
    return 2;
  }
  if (cfg.placement.empty()) {
    std::fprintf(stderr, "dilococtl demo: %s has no placement; the demo runs placement {syncer: site-s, learners: "
                         "[site-a, site-b]}\n", config_path.c_str());
    return 2;
  }
  std::string dir = cmd.dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/dilococtl-demo-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::fprintf(stderr, "dilococtl demo: cannot create a directory like %s\n", pattern.c_str());
      return 1;
    }
    dir = pattern;
  }
  std::vector<std::string> sites;  // the syncer's first, each once
  for (const std::vector<std::string>* list : {&cfg.placement.syncer, &cfg.placement.learners})
    for (const std::string& s : *list)
      if (std::find(sites.begin(), sites.end(), s) == sites.end()) sites.push_back(s);

  LocalClusterOptions options;
  options.dir = dir;
  options.sites = sites;
  options.dilocod_path = SelfDir() + "/dilocod";
  options.curve = true;
  options.threads_per_site = 1;
  // The sites read the run's corpus, and only that: its directory is their one data root.
  std::error_code ec;
  const fs::path corpus = fs::weakly_canonical(cfg.data.corpus, ec);
  options.data_roots = {fs::is_directory(corpus, ec) ? corpus.string() : corpus.parent_path().string()};
  std::unique_ptr<LocalCluster> cluster;
  if (Status st = LocalCluster::Create(options, &cluster); !st.ok()) return Failed(nullptr, st.message());
  std::fprintf(stderr, "dilococtl demo: starting %zu dilocod processes on loopback (CURVE) under %s\n", sites.size(),
               dir.c_str());
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (Status st = cluster->StartAll(); !st.ok()) return Failed(cluster.get(), st.message());

  // Submit to a learner site: it forwards the job to the others.
  const std::string submit_site = cfg.placement.learners.empty() ? sites[0] : cfg.placement.learners[0];
  const std::string socket = cluster->SocketPath(submit_site);
  std::string overrides;
  for (const std::string& o : cmd.overrides) overrides += o + "\n";
  std::string text;
  (void)ReadWholeFile(config_path, "run config", &text);
  ControlArgs reply;
  Status st = CallDaemon(socket, "submit", kNoJob,
                         {{"config_yaml", text}, {"source", config_path},
                          {"base_dir", fs::absolute(config_path).parent_path().string()}, {"overrides", overrides}},
                         &reply, 30000);
  if (!st.ok()) return Failed(cluster.get(), "submit: " + st.message());
  const std::string job = reply["job"];
  std::fprintf(stderr, "dilococtl demo: submitted %s to %s as job %s\n", config_path.c_str(), submit_site.c_str(),
               job.c_str());

  const bool tty = isatty(STDERR_FILENO);
  nlohmann::json status;
  auto last_print = Clock::now() - std::chrono::hours(1);
  int lines_drawn = 0;
  for (;;) {
    if (g_interrupted) return Failed(cluster.get(), "interrupted; the cluster is shut down");
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 500 : 1000));
    nlohmann::json s;
    if (Status sst = CallDaemonJson(socket, "status", job, {}, &s); !sst.ok()) {
      return Failed(cluster.get(), "status: " + sst.message());
    }
    status = s;
    const std::string state = status.value("state", "");
    if (tty) {
      const std::string screen = RenderJobStatus(status, true);
      if (lines_drawn > 0) std::fprintf(stderr, "\033[%dA\033[J", lines_drawn);
      std::fprintf(stderr, "%s", screen.c_str());
      lines_drawn = (int)std::count(screen.begin(), screen.end(), '\n');
    } else if (Clock::now() - last_print > std::chrono::seconds(15) || state == "completed" || state == "failed") {
      std::fprintf(stderr, "%s\n", RenderJobStatus(status, false).c_str());
      last_print = Clock::now();
    }
    if (state == "failed" || state == "stopped") {
      return Failed(cluster.get(), "job " + job + " " + state + ": " + status.value("error", "see the logs"));
    }
    if (state == "completed" && status.contains("summary")) break;
    for (const std::string& site : sites) {
      if (!cluster->Running(site)) return Failed(cluster.get(), "the dilocod of " + site + " exited");
    }
  }
  nlohmann::json summary = status["summary"];
  summary["wall_s"] = std::chrono::duration<double>(Clock::now() - start).count();

  // What the merged model learned (the syncer writes a checkpoint.bin of it).
  const std::string ckpt_path = summary.value("checkpoint", "");
  Checkpoint ckpt;
  if (!ckpt_path.empty() && LoadCheckpoint(ckpt_path, &ckpt).ok()) {
    std::unique_ptr<TrainingBackend> model;
    if (ckpt.model.vocab_size == 256 && CreateBackend("cpu", {ckpt.model, 1}, &model).empty() &&
        CheckCheckpointFits(ckpt, ckpt.model, false).ok()) {
      model->upload_params(ckpt.params.data());
      const std::string sample = Generate(*model, "", {.tokens = 300, .temperature = 0.8, .seed = 1});
      std::fprintf(stderr, "\n--- sample from the merged model (300 bytes, temperature 0.8) ---\n%s\n---\n",
                   sample.c_str());
    }
  }
  // Curves of the run, while the daemons still answer for their run directories.
  const std::string report_path = fs::absolute(fs::path(dir) / "report.html").string();
  const Status report_st = WriteJobReport(status, report_path);
  if (!report_st.ok()) std::fprintf(stderr, "dilococtl demo: no report: %s\n", report_st.message().c_str());
  if (report_st.ok()) summary["report"] = report_path;
  if (Status sst = cluster->StopAll(); !sst.ok()) {
    std::fprintf(stderr, "dilococtl demo: shutting the cluster down: %s\n", sst.message().c_str());
  }
  std::fprintf(stderr,
               "dilococtl demo: job %s completed: final val loss %.4f (from %.4f, %d batches), %ld steps over %d learners, %.0f "
               "tok/s, %llu merges, %.1f s\n",
               job.c_str(), Num(summary, "final_val_loss", 0.0), Num(summary, "initial_val_loss", 0.0),
               Num(summary, "final_val_batches", 0), Num(summary, "steps", 0L), Num(summary, "learners", 0), Num(summary, "tokens_per_s", 0.0),
               (unsigned long long)Num(summary, "outer_steps", uint64_t{0}), summary["wall_s"].get<double>());
  std::fprintf(stderr, "dilococtl demo: run directory %s; daemon logs and state under %s\n",
               summary.value("run_dir", "").c_str(), dir.c_str());
  if (cmd.json) {
    std::printf("%s\n", summary.dump().c_str());
  } else {
    std::printf("%s", RenderJobStatus(status, false).c_str());
    std::printf("run directory: %s\n", summary.value("run_dir", "").c_str());
    if (report_st.ok()) std::printf("report: %s (open it in a browser)\n", report_path.c_str());
  }
  return 0;
}

}  // namespace diloco
