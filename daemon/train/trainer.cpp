#include "daemon/train/trainer.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon/train/checkpoint.h"
#include "daemon/train/data.h"
#include "daemon/train/local_run.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/proc_stats.h"
#include "daemon/util/progress.h"
#include "kernels/lr_schedule.h"
#include "kernels/rng.h"
#include "kernels/train_step.h"

namespace diloco {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::atomic<int> g_stop_signal{0};
void OnStopSignal(int sig) { g_stop_signal = sig; }

// Installs SIGINT/SIGTERM handlers for the life of a run, then restores.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    old_int_ = std::signal(SIGINT, OnStopSignal);
    old_term_ = std::signal(SIGTERM, OnStopSignal);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }

 private:
  void (*old_int_)(int);
  void (*old_term_)(int);
};

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return Status::Error("cannot write '" + path + "'");
  return Status::Ok();
}

}  // namespace

GptConfig GptConfigOf(const ModelConfig& m) {
  GptConfig g;
  g.block_size = m.block_size;
  g.n_layer = m.n_layer;
  g.n_embd = m.n_embd;
  g.n_head = m.n_head;
  return g;
}

LrSchedule LrScheduleOf(const TrainConfig& tc) {
  return {(float)tc.lr, (float)tc.min_lr, tc.warmup_steps, tc.lr_decay_steps > 0 ? tc.lr_decay_steps : tc.steps};
}

AdamWHyper AdamWHyperOf(const TrainConfig& tc) {
  return {.lr = (float)tc.lr,
          .beta1 = (float)tc.beta1,
          .beta2 = (float)tc.beta2,
          .eps = (float)tc.eps,
          .weight_decay = (float)tc.weight_decay};
}

double EvaluateModel(Gpt& model, const BatchSampler& val, int batches) {
  const int B = val.batch_size(), T = val.block_size();
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double sum = 0;
  for (int i = 0; i < batches; i++) {
    val.Sample(i, inputs.data(), targets.data());
    sum += model.forward(inputs.data(), targets.data(), B, T);
  }
  return sum / batches;
}

double EvaluateParams(const GptConfig& gc, const float* params, const BatchSampler& val, int batches) {
  Gpt model(gc, val.batch_size());
  std::copy(params, params + model.num_params(), model.params());
  return EvaluateModel(model, val, batches);
}

Status RunTraining(const TrainOptions& options, TrainSummary* summary) {
  if (options.config.sync.learners > 1) return RunLocal(options, summary);
  const auto run_start = Clock::now();
  const RunConfig& cfg = options.config;
  const TrainConfig& tc = cfg.train;
  omp_set_num_threads(tc.threads > 0 ? tc.threads : omp_get_num_procs());

  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, {cfg.data.val_fraction, cfg.model.block_size, 0, 1}, &corpus));

  std::error_code ec;
  fs::create_directories(options.run_dir, ec);
  if (ec) return Status::Error("cannot create run directory '" + options.run_dir + "': " + ec.message());
  const std::string checkpoint_path = (fs::path(options.run_dir) / "checkpoint.bin").string();
  const std::string config_yaml = RunConfigToYaml(cfg);

  Gpt model(GptConfigOf(cfg.model), tc.batch_size);
  AdamWState optimizer;
  long start_step = 0;
  if (options.resume) {
    Checkpoint ckpt;
    DL_RETURN_IF_ERROR(LoadCheckpoint(checkpoint_path, &ckpt).WithContext("cannot resume"));
    DL_RETURN_IF_ERROR(RestoreCheckpoint(ckpt, &model, &optimizer).WithContext("cannot resume"));
    start_step = ckpt.step;
  } else {
    if (fs::exists(checkpoint_path))
      return Status::Error("run directory '" + options.run_dir +
                           "' already holds a checkpoint: pass --resume to continue it, or choose another --out");
    model.init_weights(tc.seed);
  }
  DL_RETURN_IF_ERROR(WriteTextFile((fs::path(options.run_dir) / "config.yaml").string(), config_yaml));
  JsonlWriter metrics;
  DL_RETURN_IF_ERROR(metrics.Open((fs::path(options.run_dir) / "metrics.jsonl").string()));

  const int B = tc.batch_size, T = cfg.model.block_size;
  const BatchSampler train(corpus->train(), B, T, mix_seed(tc.seed, /*learner=*/0));
  const BatchSampler val(corpus->val(), B, T, mix_seed(tc.seed, /*validation=*/~0ULL));
  const LrSchedule schedule = LrScheduleOf(tc);
  AdamWHyper hp = AdamWHyperOf(tc);

  DL_RETURN_IF_ERROR(metrics.Write({{"event", start_step > 0 ? "resume" : "start"},
                                    {"step", start_step},
                                    {"params", model.num_params()},
                                    {"train_bytes", corpus->train().size()},
                                    {"val_bytes", corpus->val().size()},
                                    {"threads", omp_get_max_threads()}}));

  StopSignals signals;
  ProgressLine progress(options.progress, tc.log_every);
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  TrainSummary s;
  s.run_dir = options.run_dir;
  s.checkpoint = checkpoint_path;
  double recent_loss_sum = 0;
  int recent_count = 0;
  long step = start_step;
  auto save = [&](long at_step) -> Status {
    DL_RETURN_IF_ERROR(SaveCheckpoint(checkpoint_path, model, optimizer, at_step, config_yaml));
    return metrics.Write({{"event", "checkpoint"}, {"step", at_step}, {"path", checkpoint_path}});
  };

  const auto started = std::chrono::steady_clock::now();
  for (; step < tc.steps; step++) {
    if (TimeLimitReached(tc, started)) break;
    if (g_stop_signal != 0) {
      progress.Finish();
      DL_RETURN_IF_ERROR(save(step));
      return Status::Error("stopped by signal " + std::to_string(g_stop_signal.load()) + " at step " +
                           std::to_string(step) + "; checkpoint saved to '" + checkpoint_path +
                           "': continue with --resume --out " + options.run_dir);
    }
    train.Sample(step, inputs.data(), targets.data());
    hp.lr = lr_at(schedule, (int)step);
    const auto t0 = Clock::now();
    const StepStats st = train_step(model, optimizer, inputs.data(), targets.data(), B, T, hp, tc.grad_clip);
    const double dt = Seconds(t0, Clock::now());
    if (!st.applied) {
      progress.Finish();
      (void)metrics.Write({{"event", "nonfinite"}, {"step", step}, {"loss", std::isfinite(st.loss) ? st.loss : -1.0},
                           {"grad_norm", std::isfinite(st.grad_norm) ? st.grad_norm : -1.0}});
      const bool have_ckpt = fs::exists(checkpoint_path);
      return Status::Error("training diverged at step " + std::to_string(step) + ": the " +
                           (std::isfinite(st.loss) ? "gradient norm" : "loss") +
                           " is NaN or Inf; the step was not applied. " +
                           (have_ckpt ? "The last good checkpoint is '" + checkpoint_path + "'"
                                      : std::string("No checkpoint was written yet")) +
                           ". Try a lower train.lr or train.grad_clip");
    }
    s.train_s += dt;
    s.tokens += (long)B * T;
    recent_loss_sum += st.loss;
    recent_count++;
    const double tok_s = s.tokens / s.train_s;
    DL_RETURN_IF_ERROR(metrics.Write({{"step", step + 1},
                                      {"loss", st.loss},
                                      {"lr", hp.lr},
                                      {"grad_norm", st.grad_norm},
                                      {"tokens", s.tokens},
                                      {"step_ms", dt * 1e3},
                                      {"tok_per_s", tok_s}}));
    if (!options.quiet) {
      char line[160];
      std::snprintf(line, sizeof line, "step %ld/%d | loss %.4f | lr %.2e | %.0f tok/s", step + 1, tc.steps, st.loss,
                    hp.lr, tok_s);
      progress.Update(step + 1 - start_step, tc.steps - start_step, line);
    }
    if ((step + 1) % tc.log_every == 0) {
      s.final_train_loss = recent_loss_sum / recent_count;
      recent_loss_sum = 0;
      recent_count = 0;
    }
    const bool last = step + 1 == tc.steps;
    if (!last && cfg.eval.every > 0 && (step + 1) % cfg.eval.every == 0) {
      const double vl = EvaluateModel(model, val, cfg.eval.batches);
      DL_RETURN_IF_ERROR(metrics.Write({{"event", "eval"}, {"step", step + 1}, {"val_loss", vl}}));
      if (!options.quiet) {
        progress.Finish();
        std::fprintf(stderr, "step %ld: val loss %.4f\n", step + 1, vl);
      }
    }
    if (!last && tc.checkpoint_every > 0 && (step + 1) % tc.checkpoint_every == 0) DL_RETURN_IF_ERROR(save(step + 1));
  }
  progress.Finish();
  if (recent_count > 0) s.final_train_loss = recent_loss_sum / recent_count;

  s.final_val_loss = EvaluateModel(model, val, cfg.eval.batches);
  s.steps = step;
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "eval"}, {"step", step}, {"val_loss", s.final_val_loss}}));
  DL_RETURN_IF_ERROR(save(step));
  s.tokens_per_s = s.train_s > 0 ? s.tokens / s.train_s : 0;
  s.peak_rss_mb = peak_rss_mb();
  s.wall_s = Seconds(run_start, Clock::now());
  nlohmann::json summary_event = TrainSummaryObject(s);
  summary_event["event"] = "summary";
  DL_RETURN_IF_ERROR(metrics.Write(summary_event));
  *summary = s;
  return Status::Ok();
}

nlohmann::json TrainSummaryObject(const TrainSummary& s) {
  nlohmann::json j = {{"final_val_loss", s.final_val_loss},
                            {"final_train_loss", s.final_train_loss},
                            {"steps", s.steps},
                            {"tokens", s.tokens},
                            {"wall_s", s.wall_s},
                            {"train_s", s.train_s},
                            {"tokens_per_s", s.tokens_per_s},
                            {"bytes_up", s.bytes_up},
                            {"bytes_down", s.bytes_down},
                            {"peak_rss_mb", s.peak_rss_mb},
                            {"learners", s.learners},
                            {"run_dir", s.run_dir},
                            {"checkpoint", s.checkpoint}};
  if (s.learners > 1) {
    j["outer_steps"] = s.outer_steps;
    j["dropped_deltas"] = s.dropped_deltas;
    j["rejected_deltas"] = s.rejected_deltas;
    j["initial_val_loss"] = s.initial_val_loss;
    j["learner_tokens"] = s.learner_tokens;
    j["versions"] = s.versions;
  }
  return j;
}

std::string TrainSummaryJson(const TrainSummary& s) { return TrainSummaryObject(s).dump(); }

}  // namespace diloco
