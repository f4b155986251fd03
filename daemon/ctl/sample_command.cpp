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
  if (ckpt.model.vocab_size != 256) {
    std::fprintf(stderr,
                 "dilococtl sample: '%s' is a model of %d tokens; sample writes bytes, so it needs a byte-level "
                 "model (data.format bytes, vocab 256). Decode token models with their own tokenizer\n",
                 cmd.checkpoint.c_str(), ckpt.model.vocab_size);
    return 1;
  }
  std::unique_ptr<TrainingBackend> model;
  if (std::string err = CreateBackend("cpu", {ckpt.model, 1}, &model); !err.empty()) {
    std::fprintf(stderr, "dilococtl sample: %s\n", err.c_str());
    return 1;
  }
  if (const Status st = CheckCheckpointFits(ckpt, ckpt.model, false); !st.ok()) {
    std::fprintf(stderr, "dilococtl sample: %s\n", st.message().c_str());
    return 1;
  }
  model->upload_params(ckpt.params.data());
  std::fwrite(cmd.prompt.data(), 1, cmd.prompt.size(), stdout);
  Generate(*model, cmd.prompt, {cmd.tokens, cmd.temperature, cmd.seed}, [](char c) {
    std::fputc(c, stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace diloco
