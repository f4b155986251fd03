// dilococtl eval: validation loss of a model (checkpoint file, run directory or job) on its run's
// corpus split, sampled like training's evaluations or over the whole split with --full
// (daemon/export/model_eval.h).
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "apps/dilococtl/job_commands.h"
#ifdef DILOCO_HAVE_EXPORT
#include "apps/dilococtl/model_arg.h"
#include "daemon/export/model_eval.h"
#include "daemon/util/progress.h"
#endif

namespace diloco {

int RunEvalCommand(const EvalCommand& cmd) {
  if (cmd.full && cmd.batches > 0) {
    std::fprintf(stderr, "dilococtl eval: --batches and --full exclude each other (--full: the whole split)\n");
    return 2;
  }
  if (cmd.batches < 0) {
    std::fprintf(stderr, "dilococtl eval: --batches %d must be positive\n", cmd.batches);
    return 2;
  }
#ifdef DILOCO_HAVE_EXPORT
  ModelArgument arg;
  bool usage = false;
  if (Status st = ResolveModelArgument(cmd.model, cmd.daemon, &arg, &usage); !st.ok()) {
    std::fprintf(stderr, "dilococtl eval: %s\n", st.message().c_str());
    return usage ? 2 : 1;
  }
  ModelSource source;
  if (Status st = OpenModelArgument(arg, &source); !st.ok()) {
    std::fprintf(stderr, "dilococtl eval: %s\n", st.message().c_str());
    return 1;
  }
  ModelEvalOptions options;
  options.full = cmd.full;
  options.batches = cmd.batches;
  options.device = cmd.device;
  options.threads = cmd.threads;
  ProgressLine progress(isatty(STDERR_FILENO) != 0, /*every=*/50);
  if (cmd.full) {
    options.progress = [&progress](size_t done, size_t total) {
      progress.Update((long)done, (long)total, "eval: " + std::to_string(done) + "/" + std::to_string(total) + " windows");
    };
  }
  ModelEvalResult r;
  const Status st = EvaluateModel(source, options, &r);
  progress.Finish();
  if (!st.ok()) {
    std::fprintf(stderr, "dilococtl eval: %s\n", st.message().c_str());
    return 1;
  }
  if (cmd.json) {
    nlohmann::json j = {{"val_loss", r.val_loss},
                        {"batches", r.batches},
                        {"tokens", r.tokens},
                        {"windows", r.windows},
                        {"mode", r.mode},
                        {"bits_per_byte", r.tokens_are_bytes ? nlohmann::json(r.bits_per_token) : nlohmann::json()},
                        {"bits_per_token", r.bits_per_token},
                        {"job", source.job_id},
                        {"source", source.params_path},
                        {"source_kind", source.params_kind},
                        {"training_steps", source.training_steps ? nlohmann::json(*source.training_steps) : nlohmann::json()},
                        {"merges", source.merges ? nlohmann::json(*source.merges) : nlohmann::json()},
                        {"corpus", r.corpus},
                        {"val_begin", r.val_begin},
                        {"val_tokens", r.val_tokens}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("job %s (%s, %s training steps, %s merges), %s\n", source.job_id.c_str(), source.params_kind.c_str(),
              CountText(source.training_steps).c_str(), CountText(source.merges).c_str(), source.params_path.c_str());
  std::printf("val_loss %.6f  (%s: %lld batches, %lld tokens of %lld in the split)\n", r.val_loss,
              r.mode == "full" ? "whole split" : "sampled", (long long)r.batches, (long long)r.tokens,
              (long long)r.val_tokens);
  std::printf("%s %.4f\n", r.tokens_are_bytes ? "bits_per_byte" : "bits_per_token", r.bits_per_token);
  return 0;
#else
  std::fprintf(stderr, "dilococtl eval: this build has no evaluator (daemon/export)\n");
  return 1;
#endif
}

}  // namespace diloco
