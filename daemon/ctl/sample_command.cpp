#include <cstdio>

#include "daemon/ctl/commands.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/generate.h"

namespace diloco {

int RunSampleCommand(const SampleCommand& cmd) {
  if (cmd.tokens < 0 || cmd.temperature < 0) {
    std::fprintf(stderr, "dilococtl sample: --tokens and --temperature must not be negative\n");
    return 2;
  }
  Checkpoint ckpt;
  if (const Status st = LoadCheckpoint(cmd.checkpoint, &ckpt); !st.ok()) {
    std::fprintf(stderr, "dilococtl sample: %s\n", st.message().c_str());
    return 1;
  }
  Gpt model(ckpt.model, 1);
  if (const Status st = RestoreCheckpoint(ckpt, &model, nullptr); !st.ok()) {
    std::fprintf(stderr, "dilococtl sample: %s\n", st.message().c_str());
    return 1;
  }
  std::fwrite(cmd.prompt.data(), 1, cmd.prompt.size(), stdout);
  Generate(model, cmd.prompt, {cmd.tokens, cmd.temperature, cmd.seed}, [](char c) {
    std::fputc(c, stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace diloco
