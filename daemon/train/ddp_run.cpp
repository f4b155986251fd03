#include "daemon/train/ddp_run.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "daemon/sync/goodput_builder.h"
#include "daemon/sync/protocol.h"  // LearnerName
#include "daemon/train/chaos_runner.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/data.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/step_stretch.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/proc_stats.h"
#include "kernels/rng.h"

namespace diloco {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Chaos on a data-parallel ring, as data parallel lives it: a learner that dies or is cut off
// stops every rank (the all-reduce cannot complete without it); once every learner is back the
// job resumes from its last checkpoint. Slowdowns stretch one learner's steps, and so the
// ring's. Lost or corrupted messages and syncer faults do not apply (no WAN, no syncer).
class DdpChaos final : public ChaosTarget {
 public:
  explicit DdpChaos(int learners) : down_(learners), slowdown_(learners) {
    for (auto& d : down_) d = false;
    for (auto& f : slowdown_) f = 1.0;
  }
  std::atomic<bool> halt{false};  // the ring stops at its next step
  std::atomic<long> step{0};

  bool AnyDown() const {
    for (const auto& d : down_)
      if (d) return true;
    return false;
  }
  bool Down(int i) const { return down_[i]; }
  double Slowdown(int i) const { return slowdown_[i]; }

  void KillLearner(int i) override { Fail(i); }
  void RestartLearner(int i) override { down_[i] = false; }
  void SetSlowdown(int i, double f) override { slowdown_[i] = f; }
  void SetPartitioned(int i, bool p) override {
    if (p) Fail(i);
    else down_[i] = false;
  }
  void SetLoss(int, double) override {}
  void SetCorrupt(int, double) override {}
  void KillSyncer(int) override {}
  void RestartSyncer(int) override {}
  long LearnerStep(int) const override { return step; }

 private:
  void Fail(int i) {
    down_[i] = true;
    halt = true;
  }
  std::vector<std::atomic<bool>> down_;
  std::vector<std::atomic<double>> slowdown_;
};

struct DdpLearnerResult {
  long steps = 0;
  long tokens = 0;
  double train_s = 0;
  double provisioned_s = 0;  // NominalTokensPerS's time (sync/goodput.h)
  double final_train_loss = 0;
  uint64_t bytes_up = 0;
};

// The hook of learner i's first rank: its metrics lines and slowdown; learner 0's also ends the
// run (train.time_limit_s; every rank stops at the same step because rank 0 decides) and writes
// the checkpoints (every copy is the same).
class DdpHook final : public InnerLoopHook {
 public:
  DdpHook(const RunConfig& cfg, int learner, int ranks_per_learner, uint64_t ring_bytes, JsonlWriter* metrics,
          std::mutex* metrics_mu, const std::string& checkpoint_path, DdpLearnerResult* res, DdpChaos* chaos,
          std::vector<std::pair<int64_t, long>>* step_log, std::function<void(int, long)> before_step)
      : cfg_(cfg), learner_(learner), ring_bytes_(ring_bytes), metrics_(metrics), metrics_mu_(metrics_mu),
        checkpoint_path_(checkpoint_path), res_(res), chaos_(chaos), step_log_(step_log),
        before_step_(std::move(before_step)),
        stretch_(cfg, learner),
        tokens_per_step_((long)ranks_per_learner * cfg.train.batch_size * cfg.model.block_size),
        started_(Clock::now()) {}

  Status BeforeStep(long step, TrainingBackend&, StepControl* control) override {
    if (before_step_) before_step_(learner_, step);
    control->stop = TimeLimitReached(cfg_.train, started_) || (chaos_ && chaos_->halt);
    return Status::Ok();
  }

  Status AfterStep(const StepResult& r, TrainingBackend& backend) override {
    const TrainConfig& tc = cfg_.train;
    const std::string me = LearnerName(learner_);
    if (!r.stats.applied)
      return Status::Error(me + ": training diverged at step " + std::to_string(r.step) +
                           " (the averaged loss or gradient is NaN/Inf). Try a lower train.lr or train.grad_clip");
    // A slow learner is slow at every step: the others wait for it in the next all-reduce.
    const StretchedStep s = stretch_.Apply(r.step_s, chaos_ ? chaos_->Slowdown(learner_) : 1.0);
    const double step_s = s.step_s;
    res_->train_s += step_s;
    res_->provisioned_s += s.provisioned_s;
    res_->tokens += tokens_per_step_;
    res_->bytes_up += ring_bytes_;
    recent_sum_ += r.stats.loss;
    recent_n_++;
    const long done = r.step + 1;
    res_->steps = done;
    if (learner_ == 0 && step_log_) step_log_->push_back({UnixMs(), done});
    if (chaos_ && learner_ == 0) chaos_->step = done;
    if (done % tc.log_every == 0 || done == tc.steps) {
      res_->final_train_loss = recent_sum_ / recent_n_;
      recent_sum_ = 0;
      recent_n_ = 0;
      std::lock_guard<std::mutex> lock(*metrics_mu_);
      (void)metrics_->Write({{"learner", learner_},
                             {"step", done},
                             {"loss", r.stats.loss},
                             {"lr", r.lr},
                             {"grad_norm", r.stats.grad_norm},
                             {"tokens", res_->tokens},
                             {"step_ms", step_s * 1e3},
                             {"tok_per_s", res_->tokens / res_->train_s},
                             {"time_ms", UnixMs()},
                             {"bytes_up", res_->bytes_up}});
    }
    if (learner_ == 0 && tc.checkpoint_every > 0 && done % tc.checkpoint_every == 0 && done < tc.steps)
      return SaveCheckpoint(checkpoint_path_, *ring_, done, RunConfigToYaml(cfg_));
    return Status::Ok();
  }

 void SetRing(const LocalRing* ring) { ring_ = ring; }

 private:
  const LocalRing* ring_ = nullptr;  // checkpoints gather the AdamW state of every rank
  const RunConfig& cfg_;
  const int learner_;
  const uint64_t ring_bytes_;
  JsonlWriter* metrics_;
  std::mutex* metrics_mu_;
  const std::string checkpoint_path_;
  DdpLearnerResult* res_;
  DdpChaos* chaos_;                                  // null without chaos
  std::vector<std::pair<int64_t, long>>* step_log_;  // learner 0: (Unix ms, steps done)
  std::function<void(int, long)> before_step_;      // test hook; may be empty
  StepStretch stretch_;
  const long tokens_per_step_;
  const Clock::time_point started_;
  double recent_sum_ = 0;
  int recent_n_ = 0;
};

}  // namespace

Status RunLocalDdp(const TrainOptions& options, TrainSummary* summary, LocalRunDetails* details,
                   const LocalRunHooks& run_hooks) {
  const auto run_start = Clock::now();
  const RunConfig& cfg = options.config;
  const TrainConfig& tc = cfg.train;
  const int M = cfg.sync.learners, R = tc.ranks;
  TrainConfig whole_ring = tc;  // the M learners share one ring
  whole_ring.ranks = M * R;
  DL_RETURN_IF_ERROR(CheckTrainDevice(whole_ring));
  const int total_threads = tc.threads > 0 ? tc.threads : omp_get_num_procs();
  omp_set_num_threads(total_threads);

  // Every learner's shard, and the validation split (the same tail for everyone).
  std::vector<std::unique_ptr<Corpus>> corpora(M);
  for (int i = 0; i < M; i++) DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, i, M), &corpora[i]));
  const int B = tc.batch_size, T = cfg.model.block_size;
  std::vector<BatchSampler> samplers;
  for (int i = 0; i < M; i++) samplers.push_back(TrainSampler(*corpora[i], R * B, T, mix_seed(tc.seed, (uint64_t)i)));
  const BatchSampler val = ValSampler(*corpora[0], B, T, tc.seed);

  LocalRingOptions ro = LocalRingOptionsOf(cfg, total_threads);
  ro.ranks = M * R;
  std::unique_ptr<LocalRing> ring;
  DL_RETURN_IF_ERROR(LocalRing::Create(ro, &ring));
  const size_t N = ring->backend(0).num_params();
  const std::string checkpoint_path = (fs::path(options.run_dir) / "checkpoint.bin").string();
  long start_step = 0;
  DL_RETURN_IF_ERROR(StartRing(options, checkpoint_path, ring.get(), &start_step).WithContext("ddp"));
  DL_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, cfg));
  JsonlWriter metrics;
  std::mutex metrics_mu;
  DL_RETURN_IF_ERROR(metrics.Open((fs::path(options.run_dir) / "metrics.jsonl").string()));
  LearnerMetricsFiles learner_metrics;  // each learner's lines (run_dir.h)
  DL_RETURN_IF_ERROR(learner_metrics.Open(options.run_dir, M));
  TrainSummary s;
  s.learners = M;
  s.run_dir = options.run_dir;
  s.checkpoint = checkpoint_path;
  s.initial_val_loss = EvaluateBackend(ring->backend(0), val, cfg.eval.batches);
  DL_RETURN_IF_ERROR(metrics.Write({{"event", start_step > 0 ? "resume" : "start"},
                                    {"step", start_step},
                                    {"params", N},
                                    {"learners", M},
                                    {"mode", "ddp"},
                                    {"device", ring->description()},
                                    {"ranks", R},
                                    {"val_loss", s.initial_val_loss},
                                    {"threads", total_threads}}));

  const uint64_t ring_bytes = RingBytesPerMember(M, N);
  std::vector<DdpLearnerResult> results(M);
  std::unique_ptr<DdpChaos> chaos_target;
  std::unique_ptr<ChaosRunner> chaos;
  std::vector<std::pair<int64_t, long>> step_log, discarded_log;
  if (!cfg.chaos.empty()) {
    chaos_target = std::make_unique<DdpChaos>(M);
    // A fault before the first periodic checkpoint rolls back to the start.
    DL_RETURN_IF_ERROR(SaveCheckpoint(checkpoint_path, *ring, start_step, RunConfigToYaml(cfg)));
  }
  std::vector<std::unique_ptr<DdpHook>> hooks;
  for (int i = 0; i < M; i++)
    hooks.push_back(std::make_unique<DdpHook>(cfg, i, R, ring_bytes, learner_metrics.writer(i), learner_metrics.mu(i),
                                              checkpoint_path, &results[i], chaos_target.get(), &step_log,
                                              run_hooks.before_step));
  for (auto& hook : hooks) hook->SetRing(ring.get());
  long step = start_step;
  std::vector<uint32_t> param_crc(M * R);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> down_spans(M), blocked_spans(M);
  if (chaos_target) {
    chaos = std::make_unique<ChaosRunner>(ExpandChaos(cfg.chaos, M, 7 * 24 * 3600.0), chaos_target.get(),
                                          [&](double t_s, const ChaosAction& a) {
                                            std::lock_guard<std::mutex> lock(metrics_mu);
                                            (void)metrics.Write(ChaosEventJson(t_s, a));
                                          });
    chaos->Start();
  }
  const int64_t train_start_unix_ms = UnixMs();
  for (long from = start_step;;) {
    DL_RETURN_IF_ERROR(ring->Run([&](int g) -> Status {
      const int learner = g / R, rank = g % R;
      long done = 0;
      DL_RETURN_IF_ERROR(RunInnerLoop(RankLoopOptions(cfg, samplers[learner], rank, from), ring->backend(g),
                                      ring->comm(g), rank == 0 ? hooks[learner].get() : nullptr, &done));
      param_crc[g] = ParamsCrc32c(ring->backend(g));
      if (g == 0) step = done;
      return Status::Ok();
    }));
    if (!chaos_target || !chaos_target->halt || step >= tc.steps) break;
    // A learner failed: everyone waits until it is back, then the job restarts from its last
    // checkpoint; the steps since are lost (the rolled-back work is "discarded").
    const int64_t halted_at = UnixMs();
    std::vector<bool> was_down(M);
    for (int i = 0; i < M; i++) was_down[i] = chaos_target->Down(i);
    while (chaos_target->AnyDown()) {
      bool coming_back = true;
      for (int i = 0; i < M; i++) coming_back &= !chaos_target->Down(i) || chaos->RestartPending(i);
      if (!coming_back)
        return Status::Error("ddp: a learner failed and is never restarted (chaos); a data-parallel job cannot go on");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (int i = 0; i < M; i++) was_down[i] = was_down[i] || chaos_target->Down(i);
    }
    TrainOptions resume = options;
    resume.resume = true;
    DL_RETURN_IF_ERROR(StartRing(resume, checkpoint_path, ring.get(), &from).WithContext("ddp: restarting after a fault"));
    for (auto it = step_log.begin(); it != step_log.end();)
      if (it->second > from) {
        discarded_log.push_back(*it);
        it = step_log.erase(it);
      } else {
        ++it;
      }
    const int64_t resumed_at = UnixMs();
    for (int i = 0; i < M; i++) (was_down[i] ? down_spans : blocked_spans)[i].push_back({halted_at, resumed_at});
    chaos_target->step = from;
    chaos_target->halt = false;
    std::lock_guard<std::mutex> lock(metrics_mu);
    (void)metrics.Write({{"event", "resume"}, {"step", from}, {"after_fault_s", (resumed_at - halted_at) / 1e3}});
  }
  if (chaos) chaos->Stop();
  for (int g = 1; g < M * R; g++)
    if (param_crc[g] != param_crc[0])
      return Status::Error("ddp: rank " + std::to_string(g) + " ended with other parameters than rank 0 " +
                           "(the all-reduce must leave every copy bitwise equal); this is a bug");
  DL_RETURN_IF_ERROR(SaveCheckpoint(checkpoint_path, *ring, step, RunConfigToYaml(cfg)));

  if (details) *details = {};
  for (int i = 0; i < M; i++) {
    DdpLearnerResult& r = results[i];
    r.steps = step;
    s.steps += r.tokens / ((long)R * B * T);
    s.tokens += r.tokens;
    s.train_s = std::max(s.train_s, r.train_s);
    s.bytes_up += r.bytes_up;
    s.final_train_loss += r.final_train_loss / M;
    s.learner_tokens.push_back(r.tokens);
    if (details) {
      details->snapshots_installed.push_back(0);
      details->crc_mismatches.push_back(0);
      details->gaps.push_back(0);
      details->incarnations.push_back(1);
      details->param_crc32c.push_back(param_crc[i * R]);
    }
    DL_RETURN_IF_ERROR(metrics.Write({{"event", "learner_done"},
                                      {"learner", i},
                                      {"steps", r.steps},
                                      {"tokens", r.tokens},
                                      {"bytes_up", r.bytes_up},
                                      {"param_crc32c", param_crc[i * R]}}));
  }
  s.outer_steps = (uint64_t)(step - start_step);  // one all-reduce per step
  s.versions = {(uint64_t)step};
  omp_set_num_threads(total_threads);
  s.final_val_loss = EvaluateBackend(ring->backend(0), val, cfg.eval.batches);
  s.final_val_batches = cfg.eval.batches;
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "eval"}, {"step", s.steps}, {"val_loss", s.final_val_loss}}));
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "checkpoint"}, {"step", step}, {"path", checkpoint_path}}));
  s.tokens_per_s = s.train_s > 0 ? s.tokens / s.train_s : 0;
  {
    // Goodput (sync/goodput.h): every step that survived into the model reached the global one,
    // as one fragment merged every step.
    const double tokens_per_step = (double)R * B * T;
    GoodputBuilder b(train_start_unix_ms, M, {1.0}, tokens_per_step, /*inner_steps=*/1);
    for (int i = 0; i < M; i++) {
      b.AddWork(i, (double)results[i].tokens, results[i].provisioned_s);
      for (const auto& [from, to] : down_spans[i]) b.AddSpan(i, from, to, Activity::kDown);
      for (const auto& [from, to] : blocked_spans[i]) b.AddSpan(i, from, to, Activity::kBlocked);
      for (const auto& [t, st] : step_log) b.AddMerged(t, 0, i, tokens_per_step);
      for (const auto& [t, st] : discarded_log) b.AddLost(t, 0, i, tokens_per_step, LossCause::kDiscarded);
    }
    GoodputInput in;
    GoodputReport g;
    if (Status st = b.Build(UnixMs(), &in); st.ok() && ComputeGoodput(in, &g).ok()) s.goodput = g;
  }
  s.peak_rss_mb = peak_rss_mb();
  s.wall_s = Seconds(run_start, Clock::now());
  nlohmann::json ev = TrainSummaryObject(s);
  ev["event"] = "summary";
  DL_RETURN_IF_ERROR(metrics.Write(ev));
  *summary = s;
  return Status::Ok();
}

}  // namespace diloco
