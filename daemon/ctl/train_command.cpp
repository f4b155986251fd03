#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "daemon/ctl/commands.h"
#include "daemon/train/trainer.h"

namespace diloco {

namespace {

// runs/<config name>-<YYYYmmdd-HHMMSS>
std::string DefaultRunDir(const std::string& config_path) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return "runs/" + std::filesystem::path(config_path).stem().string() + "-" + stamp;
}

}  // namespace

int RunTrainCommand(const TrainCommand& cmd) {
  TrainOptions options;
  if (const Status st = LoadRunConfig(cmd.config_path, cmd.overrides, &options.config); !st.ok()) {
    std::fprintf(stderr, "dilococtl train: %s\n", st.message().c_str());
    return 2;
  }
  // A device this build or machine lacks: refused before anything starts (no run directory).
  const int learners = options.config.sync.learners;
  TrainConfig ring = options.config.train;
  if (options.config.sync.mode == SyncMode::kDdp) ring.ranks *= learners;  // one ring of every learner's ranks
  Status device_ok = CheckTrainDevice(ring);
  std::string device;
  if (device_ok.ok() && options.config.sync.mode != SyncMode::kDdp) device_ok = LearnerDevice(ring, 0, learners, &device);
  if (!device_ok.ok()) {
    std::fprintf(stderr, "dilococtl train: %s\n", device_ok.message().c_str());
    return 2;
  }
  if (cmd.resume && cmd.out_dir.empty()) {
    std::fprintf(stderr, "dilococtl train: --resume needs --out DIR, the run directory to continue\n");
    return 2;
  }
  options.run_dir = cmd.out_dir.empty() ? DefaultRunDir(cmd.config_path) : cmd.out_dir;
  options.resume = cmd.resume;
  options.progress = isatty(STDERR_FILENO);
  std::fprintf(stderr, "dilococtl train: %s -> %s\n", cmd.config_path.c_str(), options.run_dir.c_str());

  TrainSummary summary;
  if (const Status st = RunTraining(options, &summary); !st.ok()) {
    std::fprintf(stderr, "dilococtl train: %s\n", st.message().c_str());
    return 1;
  }
  if (cmd.json) {
    std::printf("%s\n", TrainSummaryJson(summary).c_str());
  } else {
    std::printf("done: %ld steps, %ld tokens in %.1f s (%.0f tok/s training), final val loss %.4f (%d batches)\n",
                summary.steps, summary.tokens, summary.wall_s, summary.tokens_per_s, summary.final_val_loss,
                summary.final_val_batches);
    std::printf("run directory: %s (checkpoint.bin, metrics.jsonl, config.yaml)\n", summary.run_dir.c_str());
  }
  return 0;
}

}  // namespace diloco
