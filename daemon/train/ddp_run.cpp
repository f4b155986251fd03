#include "daemon/train/ddp_run.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>

#include "daemon/train/checkpoint.h"
#include "daemon/train/data.h"
#include "daemon/train/thread_ring.h"
#include "daemon/util/crc32c.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/proc_stats.h"
#include "kernels/gpt.h"
#include "kernels/grad_clip.h"
#include "kernels/lr_schedule.h"
#include "kernels/rng.h"

namespace diloco {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct DdpLearnerResult {
  long steps = 0;
  long tokens = 0;
  double train_s = 0;
  double wait_s = 0;  // blocked in the all-reduce
  double final_train_loss = 0;
  uint64_t bytes_up = 0;
  uint32_t param_crc32c = 0;
};

}  // namespace

Status RunLocalDdp(const TrainOptions& options, TrainSummary* summary, LocalRunDetails* details) {
  const auto run_start = Clock::now();
  const RunConfig& cfg = options.config;
  const TrainConfig& tc = cfg.train;
  const int M = cfg.sync.learners;

  std::error_code ec;
  fs::create_directories(options.run_dir, ec);
  if (ec) return Status::Error("cannot create run directory '" + options.run_dir + "': " + ec.message());
  const std::string checkpoint_path = (fs::path(options.run_dir) / "checkpoint.bin").string();
  const std::string config_yaml = RunConfigToYaml(cfg);
  const GptConfig gc = GptConfigOf(cfg.model);
  const TensorTable table = gpt_tensor_table(gc);
  const size_t N = table.total_numel();
  std::vector<float> init(N);
  AdamWState init_opt;
  long start_step = 0;
  if (options.resume) {
    Checkpoint ckpt;
    DL_RETURN_IF_ERROR(LoadCheckpoint(checkpoint_path, &ckpt).WithContext("cannot resume the ddp run"));
    Gpt probe(gc, 1);
    DL_RETURN_IF_ERROR(RestoreCheckpoint(ckpt, &probe, &init_opt).WithContext("cannot resume the ddp run"));
    std::memcpy(init.data(), probe.params(), N * sizeof(float));
    start_step = ckpt.step;
  } else {
    if (fs::exists(checkpoint_path))
      return Status::Error("run directory '" + options.run_dir +
                           "' already holds a checkpoint: pass --resume to continue it, or choose another --out");
    gpt_init_params(gc, tc.seed, init.data());
  }
  {
    std::ofstream f(fs::path(options.run_dir) / "config.yaml", std::ios::binary | std::ios::trunc);
    f << config_yaml;
    if (!f) return Status::Error("cannot write config.yaml in '" + options.run_dir + "'");
  }
  JsonlWriter metrics;
  std::mutex metrics_mu;
  DL_RETURN_IF_ERROR(metrics.Open((fs::path(options.run_dir) / "metrics.jsonl").string()));
  std::unique_ptr<Corpus> val_corpus;
  DL_RETURN_IF_ERROR(
      Corpus::Load(cfg.data.corpus, {cfg.data.val_fraction, cfg.model.block_size, 0, M}, &val_corpus));
  const BatchSampler val(val_corpus->val(), tc.batch_size, cfg.model.block_size, mix_seed(tc.seed, ~0ULL));
  const int total_threads = tc.threads > 0 ? tc.threads : omp_get_num_procs();
  omp_set_num_threads(total_threads);
  TrainSummary s;
  s.learners = M;
  s.run_dir = options.run_dir;
  s.checkpoint = checkpoint_path;
  s.initial_val_loss = EvaluateParams(gc, init.data(), val, cfg.eval.batches);
  DL_RETURN_IF_ERROR(metrics.Write({{"event", start_step > 0 ? "resume" : "start"},
                                    {"step", start_step},
                                    {"params", N},
                                    {"learners", M},
                                    {"mode", "ddp"},
                                    {"val_loss", s.initial_val_loss},
                                    {"threads", total_threads}}));

  ThreadRing ring(M, N);
  // train.time_limit_s: learner 0 names the last step (the one it is about to start) before that
  // step's all-reduce; every learner compares it with the step it just all-reduced. Whoever reads
  // before the write is at an earlier step, so all stop after the same step.
  const auto started = Clock::now();
  std::atomic<long> last_step{std::numeric_limits<long>::max()};
  std::vector<float> final_params;  // learner 0's (= everyone's) at the end
  const uint64_t ring_bytes = ThreadRing::RingBytesPerMember(M, N);
  std::vector<DdpLearnerResult> results(M);
  std::vector<Status> statuses(M);
  std::vector<std::thread> threads;
  for (int i = 0; i < M; i++) {
    threads.emplace_back([&, i] {
      Status& st = statuses[i];
      DdpLearnerResult& res = results[i];
      const std::string me = "learner-" + std::to_string(i);
      // Every way out of this thread that is not the end of training stops the others too.
      struct AbortOnError {
        ThreadRing& ring;
        Status& st;
        ~AbortOnError() {
          if (!st.ok()) ring.Abort();
        }
      } guard{ring, st};
      omp_set_num_threads(std::max(1, total_threads / M));
      std::unique_ptr<Corpus> corpus;
      st = Corpus::Load(cfg.data.corpus, {cfg.data.val_fraction, cfg.model.block_size, i, M}, &corpus);
      if (!st.ok()) return;
      const int B = tc.batch_size, T = cfg.model.block_size;
      Gpt model(gc, B);
      std::memcpy(model.params(), init.data(), N * sizeof(float));
      AdamWState optimizer = init_opt;
      const BatchSampler train(corpus->train(), B, T, mix_seed(tc.seed, (uint64_t)i));
      const LrSchedule schedule = LrScheduleOf(tc);
      AdamWHyper hp = AdamWHyperOf(tc);
      const double slowdown = SlowdownOf(cfg.learners, i);
      std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
      double recent_sum = 0;
      int recent_n = 0;
      long step = start_step;
      for (; step < tc.steps; step++) {
        train.Sample(step, inputs.data(), targets.data());
        hp.lr = lr_at(schedule, (int)step);
        if (i == 0 && last_step == std::numeric_limits<long>::max() && TimeLimitReached(tc, started))
          last_step = step;
        const auto t0 = Clock::now();
        const double loss = model.forward(inputs.data(), targets.data(), B, T);
        model.zero_grad();
        model.backward();  // a non-finite loss gives non-finite gradients: the mean shows it to all
        if (slowdown > 1) std::this_thread::sleep_for(std::chrono::duration<double>((slowdown - 1) * Seconds(t0, Clock::now())));
        const auto w0 = Clock::now();
        if (!ring.MeanInPlace(i, model.grads())) {
          st = Status::Error(me + ": stopped at step " + std::to_string(step) + " because another learner failed");
          return;
        }
        res.wait_s += Seconds(w0, Clock::now());
        res.bytes_up += ring_bytes;
        const double norm = global_norm(model.grads(), N);
        if (!std::isfinite(norm)) {
          st = Status::Error(me + ": training diverged at step " + std::to_string(step) +
                             " (the averaged gradient is NaN/Inf). Try a lower train.lr or train.grad_clip");
          return;
        }
        AdamWHyper clipped = hp;
        clipped.grad_scale = hp.grad_scale * clip_scale(norm, tc.grad_clip);
        adamw_step(model.params(), model.grads(), optimizer, model.table(), clipped);
        const double step_s = Seconds(t0, Clock::now());
        res.train_s += step_s;
        res.tokens += (long)B * T;
        recent_sum += loss;
        recent_n++;
        const long done = step + 1;
        if (done % tc.log_every == 0 || done == tc.steps) {
          res.final_train_loss = recent_sum / recent_n;
          recent_sum = 0;
          recent_n = 0;
          std::lock_guard<std::mutex> lock(metrics_mu);
          (void)metrics.Write({{"learner", i},
                               {"step", done},
                               {"loss", loss},
                               {"lr", hp.lr},
                               {"grad_norm", norm},
                               {"tokens", res.tokens},
                               {"step_ms", step_s * 1e3},
                               {"tok_per_s", res.tokens / res.train_s},
                               {"wait_s", res.wait_s},
                               {"bytes_up", res.bytes_up}});
        }
        // Every copy is the same: learner 0 checkpoints for all.
        if (i == 0 && tc.checkpoint_every > 0 && done % tc.checkpoint_every == 0 && done < tc.steps) {
          st = SaveCheckpoint(checkpoint_path, model, optimizer, done, config_yaml);
          if (!st.ok()) return;
        }
        if (step >= last_step) {
          step = done;
          break;
        }
      }
      res.steps = step;
      res.param_crc32c = Crc32c(model.params(), N * sizeof(float));
      if (i == 0) {
        st = SaveCheckpoint(checkpoint_path, model, optimizer, step, config_yaml);
        if (!st.ok()) return;
        final_params.assign(model.params(), model.params() + N);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < M; i++)
    if (!statuses[i].ok()) return statuses[i];
  for (int i = 1; i < M; i++)
    if (results[i].param_crc32c != results[0].param_crc32c)
      return Status::Error("ddp: learner " + std::to_string(i) + " ended with other parameters than learner 0 " +
                           "(the all-reduce must leave every copy bitwise equal); this is a bug");

  if (details) *details = {};
  for (int i = 0; i < M; i++) {
    const DdpLearnerResult& r = results[i];
    s.steps += r.tokens / ((long)tc.batch_size * cfg.model.block_size);
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
      details->param_crc32c.push_back(r.param_crc32c);
    }
    DL_RETURN_IF_ERROR(metrics.Write({{"event", "learner_done"},
                                      {"learner", i},
                                      {"steps", r.steps},
                                      {"tokens", r.tokens},
                                      {"wait_s", r.wait_s},
                                      {"bytes_up", r.bytes_up},
                                      {"param_crc32c", r.param_crc32c}}));
  }
  s.outer_steps = (uint64_t)(results[0].steps - start_step);  // one all-reduce per step
  s.versions = {(uint64_t)results[0].steps};
  omp_set_num_threads(total_threads);
  s.final_val_loss = EvaluateParams(gc, final_params.data(), val, cfg.eval.batches);
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "eval"}, {"step", s.steps}, {"val_loss", s.final_val_loss}}));
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "checkpoint"}, {"step", results[0].steps}, {"path", checkpoint_path}}));
  s.tokens_per_s = s.train_s > 0 ? s.tokens / s.train_s : 0;
  s.peak_rss_mb = peak_rss_mb();
  s.wall_s = Seconds(run_start, Clock::now());
  nlohmann::json ev = TrainSummaryObject(s);
  ev["event"] = "summary";
  DL_RETURN_IF_ERROR(metrics.Write(ev));
  *summary = s;
  return Status::Ok();
}

}  // namespace diloco
