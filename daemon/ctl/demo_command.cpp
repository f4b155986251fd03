#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "daemon/ctl/commands.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/generate.h"
#include "daemon/train/trainer.h"

namespace diloco {

// For now the demo is one learner training configs/demo.yaml on Debian's
// fortunes, then a short sample from the trained model.
int RunDemoCommand(const DemoCommand& cmd) {
  const std::string config_path =
      cmd.config_path.empty() ? std::string(DILOCO_SOURCE_DIR) + "/configs/demo.yaml" : cmd.config_path;
  TrainOptions options;
  if (const Status st = LoadRunConfig(config_path, cmd.overrides, &options.config); !st.ok()) {
    std::fprintf(stderr, "dilococtl demo: %s\n", st.message().c_str());
    return 2;
  }
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  options.run_dir = std::string("runs/demo-") + stamp;
  options.progress = isatty(STDERR_FILENO);
  std::fprintf(stderr, "dilococtl demo: training %s on %s -> %s\n", config_path.c_str(),
               options.config.data.corpus.c_str(), options.run_dir.c_str());
  TrainSummary summary;
  if (const Status st = RunTraining(options, &summary); !st.ok()) {
    std::fprintf(stderr, "dilococtl demo: %s\n", st.message().c_str());
    return 1;
  }
  // Show what the model learned.
  Checkpoint ckpt;
  Status st = LoadCheckpoint(summary.checkpoint, &ckpt);
  Gpt model(ckpt.model, 1);
  if (st.ok()) st = RestoreCheckpoint(ckpt, &model, nullptr);
  if (!st.ok()) {
    std::fprintf(stderr, "dilococtl demo: %s\n", st.message().c_str());
    return 1;
  }
  const std::string text = Generate(model, "", {.tokens = 300, .temperature = 0.8, .seed = 1});
  std::fprintf(stderr, "\n--- sample (300 bytes, temperature 0.8) ---\n%s\n---\n", text.c_str());
  std::fprintf(stderr, "final val loss %.4f after %ld steps, %.0f tok/s, %.1f s; run directory %s\n",
               summary.final_val_loss, summary.steps, summary.tokens_per_s, summary.wall_s, summary.run_dir.c_str());
  if (cmd.json) std::printf("%s\n", TrainSummaryJson(summary).c_str());
  return 0;
}

}  // namespace diloco
