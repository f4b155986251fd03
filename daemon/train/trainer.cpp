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
#include "daemon/train/inner_loop.h"
#include "daemon/train/local_run.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/run_dir.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/proc_stats.h"
#include "daemon/util/progress.h"
#include "kernels/lr_schedule.h"
#include "kernels/rng.h"

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

}  // namespace

CorpusOptions CorpusOptionsOf(const RunConfig& config, int learner, int num_learners) {
  CorpusOptions co;
  co.val_fraction = config.data.val_fraction;
  co.block_size = config.model.block_size;
  co.learner = learner;
  co.num_learners = num_learners;
  co.format = config.data.format;
  co.vocab_size = config.model.vocab_size;
  return co;
}

Status StartRing(const TrainOptions& options, const std::string& checkpoint_path, LocalRing* ring,
                 long* start_step) {
  const GptConfig gc = GptConfigOf(options.config.model);
  *start_step = 0;
  if (options.resume) {
    Checkpoint ckpt;
    DL_RETURN_IF_ERROR(LoadCheckpoint(checkpoint_path, &ckpt).WithContext("cannot resume"));
    DL_RETURN_IF_ERROR(CheckCheckpointFits(ckpt, gc, true).WithContext("cannot resume"));
    ring->Upload(ckpt.params.data(), &ckpt.optimizer);
    *start_step = ckpt.step;
    return Status::Ok();
  }
  if (fs::exists(checkpoint_path))
    return Status::Error("run directory '" + options.run_dir +
                         "' already holds a checkpoint: pass --resume to continue it, or choose another --out");
  std::vector<float> init(ring->backend(0).num_params());
  gpt_init_params(gc, options.config.train.seed, init.data());
  ring->Upload(init.data());
  return Status::Ok();
}

BatchSampler TrainSampler(const Corpus& corpus, int batch, int block_size, uint64_t seed) {
  return BatchSampler(corpus.train_tokens(), batch, block_size, seed);
}

BatchSampler ValSampler(const Corpus& corpus, int batch, int block_size, uint64_t run_seed) {
  return BatchSampler(corpus.val_tokens(), batch, block_size, mix_seed(run_seed, /*validation=*/~0ULL));
}

Status LearnerDevice(const TrainConfig& tc, int ordinal, int learners, std::string* device) {
  *device = tc.device;
  if (tc.device == "cpu") return Status::Ok();
  if (CheckDeviceAvailable(tc.device, learners * tc.ranks).empty()) {
    *device = RankDevice(tc.device, ordinal * tc.ranks);
    return Status::Ok();
  }
  if (tc.ranks == 1) return CheckTrainDevice(tc);  // the learners share the GPU(s)
  return Status::Error(std::to_string(learners) + " learners of train.ranks " + std::to_string(tc.ranks) + " on " +
                       tc.device + " need " + std::to_string(learners * tc.ranks) + " GPUs here: " +
                       CheckDeviceAvailable(tc.device, learners * tc.ranks));
}

uint64_t LearnerTokensPerStep(const RunConfig& config) {
  const TrainConfig& tc = config.train;
  return (uint64_t)std::max(1, tc.hosts) * (uint64_t)tc.ranks * (uint64_t)tc.batch_size *
         (uint64_t)config.model.block_size;
}

CountLimits CountLimitsOf(const RunConfig& config) {
  return {(uint64_t)std::max(0, config.train.steps), LearnerTokensPerStep(config)};
}

LocalRingOptions LocalRingOptionsOf(const RunConfig& config, int threads) {
  LocalRingOptions ro;
  ro.device = config.train.device;
  ro.ranks = config.train.ranks;
  ro.model = GptConfigOf(config.model);
  ro.batch_size = config.train.batch_size;
  ro.threads = threads;
  ro.hosts = config.train.hosts;
  ro.shard = config.train.shard;
  ro.recompute = config.train.recompute;
  ro.outer_state = config.train.outer_state;
  return ro;
}

GptConfig GptConfigOf(const ModelConfig& m) {
  GptConfig g;
  g.vocab_size = m.vocab_size;
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

double EvaluateBackend(TrainingBackend& backend, const BatchSampler& val, int batches) {
  const int B = val.batch_size(), T = val.block_size();
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double sum = 0;
  for (int i = 0; i < batches; i++) {
    val.Sample(i, inputs.data(), targets.data());
    sum += backend.eval_loss(inputs.data(), targets.data(), B, T);
  }
  return sum / batches;
}

Status EvaluateParams(const std::string& device, const GptConfig& gc, const float* params, const BatchSampler& val,
                      int batches, double* loss) {
  std::unique_ptr<TrainingBackend> backend;
  if (std::string err = CreateBackend(device, {gc, val.batch_size()}, &backend); !err.empty())
    return Status::Error("cannot evaluate on " + device + ": " + err);
  backend->upload_params(params);
  *loss = EvaluateBackend(*backend, val, batches);
  return Status::Ok();
}

Status CheckTrainDevice(const TrainConfig& tc) {
  if (std::string err = CheckDeviceAvailable(tc.device, tc.ranks); !err.empty())
    return Status::Error("train.device " + tc.device + " with train.ranks " + std::to_string(tc.ranks) + ": " + err);
  return Status::Ok();
}

namespace {

// The hook of a single learner (no outer sync): metrics.jsonl, progress, eval, checkpoints, and
// the ends of a run (time limit, SIGINT/SIGTERM, divergence).
class SingleLearnerHook final : public InnerLoopHook {
 public:
  SingleLearnerHook(const TrainOptions& options, JsonlWriter* metrics, const BatchSampler* val, long tokens_per_step,
                    long start_step, TrainSummary* summary)
      : o_(options), cfg_(options.config), metrics_(metrics), val_(val), tokens_per_step_(tokens_per_step),
        start_step_(start_step), s_(summary), progress_(options.progress, options.config.train.log_every),
        config_yaml_(RunConfigToYaml(options.config)), started_(Clock::now()) {}

  void SetRing(const LocalRing* ring) { ring_ = ring; }

  Status Save(TrainingBackend&, long at_step) {
    DL_RETURN_IF_ERROR(SaveCheckpoint(s_->checkpoint, *ring_, at_step, config_yaml_));
    return metrics_->Write({{"event", "checkpoint"}, {"step", at_step}, {"path", s_->checkpoint}});
  }

  Status BeforeStep(long step, TrainingBackend& backend, StepControl* control) override {
    if (TimeLimitReached(cfg_.train, started_)) {
      control->stop = true;
      return Status::Ok();
    }
    if (g_stop_signal == 0) return Status::Ok();
    progress_.Finish();
    DL_RETURN_IF_ERROR(Save(backend, step));
    return Status::Error("stopped by signal " + std::to_string(g_stop_signal.load()) + " at step " +
                         std::to_string(step) + "; checkpoint saved to '" + s_->checkpoint +
                         "': continue with --resume --out " + o_.run_dir);
  }

  Status AfterStep(const StepResult& r, TrainingBackend& backend) override {
    const TrainConfig& tc = cfg_.train;
    const long step = r.step;
    const StepStats& st = r.stats;
    if (!st.applied) {
      progress_.Finish();
      (void)metrics_->Write({{"event", "nonfinite"}, {"step", step}, {"loss", std::isfinite(st.loss) ? st.loss : -1.0},
                             {"grad_norm", std::isfinite(st.grad_norm) ? st.grad_norm : -1.0}});
      const bool have_ckpt = fs::exists(s_->checkpoint);
      return Status::Error("training diverged at step " + std::to_string(step) + ": the " +
                           (std::isfinite(st.loss) ? "gradient norm" : "loss") +
                           " is NaN or Inf; the step was not applied. " +
                           (have_ckpt ? "The last good checkpoint is '" + s_->checkpoint + "'"
                                      : std::string("No checkpoint was written yet")) +
                           ". Try a lower train.lr or train.grad_clip");
    }
    s_->train_s += r.step_s;
    s_->tokens += tokens_per_step_;
    recent_loss_sum_ += st.loss;
    recent_count_++;
    const double tok_s = s_->tokens / s_->train_s;
    DL_RETURN_IF_ERROR(metrics_->Write({{"step", step + 1},
                                        {"loss", st.loss},
                                        {"lr", r.lr},
                                        {"grad_norm", st.grad_norm},
                                        {"tokens", s_->tokens},
                                        {"step_ms", r.step_s * 1e3},
                                        {"tok_per_s", tok_s},
                                        {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                                        std::chrono::system_clock::now().time_since_epoch())
                                                        .count()}}));
    if (!o_.quiet) {
      char line[160];
      std::snprintf(line, sizeof line, "step %ld/%d | loss %.4f | lr %.2e | %.0f tok/s", step + 1, tc.steps, st.loss,
                    r.lr, tok_s);
      progress_.Update(step + 1 - start_step_, tc.steps - start_step_, line);
    }
    if ((step + 1) % tc.log_every == 0) {
      s_->final_train_loss = recent_loss_sum_ / recent_count_;
      recent_loss_sum_ = 0;
      recent_count_ = 0;
    }
    const bool last = step + 1 == tc.steps;
    if (!last && cfg_.eval.every > 0 && (step + 1) % cfg_.eval.every == 0) {
      const double vl = EvaluateBackend(backend, *val_, cfg_.eval.batches);
      DL_RETURN_IF_ERROR(metrics_->Write({{"event", "eval"}, {"step", step + 1}, {"val_loss", vl}}));
      if (!o_.quiet) {
        progress_.Finish();
        std::fprintf(stderr, "step %ld: val loss %.4f\n", step + 1, vl);
      }
    }
    if (!last && tc.checkpoint_every > 0 && (step + 1) % tc.checkpoint_every == 0)
      DL_RETURN_IF_ERROR(Save(backend, step + 1));
    return Status::Ok();
  }

  void Finish() {
    progress_.Finish();
    if (recent_count_ > 0) s_->final_train_loss = recent_loss_sum_ / recent_count_;
  }

 private:
  const TrainOptions& o_;
  const RunConfig& cfg_;
  JsonlWriter* metrics_;
  const BatchSampler* val_;
  const long tokens_per_step_;
  const long start_step_;
  TrainSummary* s_;
  ProgressLine progress_;
  const std::string config_yaml_;
  const LocalRing* ring_ = nullptr;  // checkpoints gather the AdamW state of every rank
  const Clock::time_point started_;
  double recent_loss_sum_ = 0;
  int recent_count_ = 0;
};

}  // namespace

Status RunTraining(const TrainOptions& options, TrainSummary* summary) {
  if (options.config.sync.learners > 1) return RunLocal(options, summary);
  const auto run_start = Clock::now();
  const RunConfig& cfg = options.config;
  const TrainConfig& tc = cfg.train;
  DL_RETURN_IF_ERROR(CheckTrainDevice(tc));
  const int total_threads = tc.threads > 0 ? tc.threads : omp_get_num_procs();
  omp_set_num_threads(total_threads);

  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, 0, 1), &corpus));
  std::unique_ptr<LocalRing> ring;
  DL_RETURN_IF_ERROR(LocalRing::Create(LocalRingOptionsOf(cfg, total_threads), &ring));

  TrainSummary s;
  s.run_dir = options.run_dir;
  s.checkpoint = (fs::path(options.run_dir) / "checkpoint.bin").string();
  long start_step = 0;
  DL_RETURN_IF_ERROR(StartRing(options, s.checkpoint, ring.get(), &start_step));
  DL_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, cfg));
  JsonlWriter metrics;
  DL_RETURN_IF_ERROR(metrics.Open((fs::path(options.run_dir) / "metrics.jsonl").string()));

  const int B = tc.batch_size, T = cfg.model.block_size, R = ring->ranks();
  const BatchSampler train = TrainSampler(*corpus, R * B, T, mix_seed(tc.seed, /*learner=*/0));
  const BatchSampler val = ValSampler(*corpus, B, T, tc.seed);
  DL_RETURN_IF_ERROR(metrics.Write({{"event", start_step > 0 ? "resume" : "start"},
                                    {"step", start_step},
                                    {"params", ring->backend(0).num_params()},
                                    {"train_tokens", corpus->train_tokens().size()},
                                    {"val_tokens", corpus->val_tokens().size()},
                                    {"device", ring->description()},
                                    {"ranks", R},
                                    {"threads", total_threads}}));

  StopSignals signals;
  SingleLearnerHook hook(options, &metrics, &val, (long)R * B * T, start_step, &s);
  hook.SetRing(ring.get());
  long step = start_step;
  DL_RETURN_IF_ERROR(ring->Run([&](int rank) -> Status {
    long done = 0;
    Status st = RunInnerLoop(RankLoopOptions(cfg, train, rank, start_step), ring->backend(rank), ring->comm(rank),
                             rank == 0 ? &hook : nullptr, &done);
    if (rank == 0) step = done;
    return st;
  }));
  hook.Finish();

  TrainingBackend& backend = ring->backend(0);
  s.final_val_loss = EvaluateBackend(backend, val, cfg.eval.batches);
  s.final_val_batches = cfg.eval.batches;
  s.steps = step;
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "eval"}, {"step", step}, {"val_loss", s.final_val_loss}}));
  DL_RETURN_IF_ERROR(hook.Save(backend, step));
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
                            {"final_val_batches", s.final_val_batches},
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
    if (s.shard_merges.size() > 1) {
      j["syncers"] = s.shard_merges.size();
      j["shard_merges"] = s.shard_merges;
    }
  }
  if (!s.global_state.empty()) j["global_state"] = s.global_state;
  if (s.goodput) j.update(GoodputToJson(*s.goodput));
  return j;
}

std::string TrainSummaryJson(const TrainSummary& s) { return TrainSummaryObject(s).dump(); }

}  // namespace diloco
