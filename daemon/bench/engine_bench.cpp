#include "daemon/bench/engine_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "daemon/util/proc_stats.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/rng.h"
#include "kernels/backend.h"

namespace diloco {

namespace {

struct Preset {
  const char* name;
  int n_layer, n_embd, n_head, block_size, batch, steps, warmup;
};
// The shapes and step counts of ../shared/peers/torch_gpt_bench.py.
constexpr Preset kPresets[] = {
    {"tiny", 2, 64, 4, 64, 8, 200, 20},
    {"small", 4, 128, 4, 128, 8, 50, 5},
    {"gpt2ish", 6, 384, 6, 256, 4, 15, 3},
};

}  // namespace

Status RunEngineBench(const EngineBenchOptions& options, EngineBenchResult* out) {
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets)
    if (options.preset == p.name) preset = &p;
  if (!preset) return Status::Error("unknown engine preset '" + options.preset + "': use tiny, small or gpt2ish");
  if (options.threads < 1) return Status::Error("--threads must be at least 1");
  omp_set_num_threads(options.threads);

  EngineBenchResult r;
  r.preset = preset->name;
  r.model.n_layer = preset->n_layer;
  r.model.n_embd = preset->n_embd;
  r.model.n_head = preset->n_head;
  r.model.block_size = preset->block_size;
  r.batch = preset->batch;
  r.threads = options.threads;
  r.steps = options.steps > 0 ? options.steps : preset->steps;
  const int warmup = options.warmup > 0 ? options.warmup : preset->warmup;
  const int B = r.batch, T = r.model.block_size;

  std::unique_ptr<TrainingBackend> model;
  if (std::string err = CreateBackend("cpu", {r.model, B}, &model); !err.empty()) return Status::Error(err);
  model->init_weights(1337);
  const size_t P = model->num_params();
  const size_t non_position = P - (size_t)T * r.model.n_embd;
  r.flops_per_token = 6.0 * non_position + 12.0 * r.model.n_layer * r.model.n_embd * T;

  Rng rng(0);
  std::vector<int> tokens((size_t)B * (T + 1));
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  std::vector<double> step_ms;
  const AdamWHyper hp{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.1f};
  for (int s = 0; s < warmup + r.steps; s++) {
    for (int b = 0; b < B; b++) {
      for (int t = 0; t <= T; t++) tokens[b * (T + 1) + t] = (int)rng.below(r.model.vocab_size);
      std::copy_n(&tokens[b * (T + 1)], T, &inputs[b * T]);
      std::copy_n(&tokens[b * (T + 1) + 1], T, &targets[b * T]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const StepStats st = model->train_step(inputs.data(), targets.data(), B, T, hp, 1.0);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s == 0) r.loss_first = st.loss;
    r.loss_last = st.loss;
    if (s >= warmup) step_ms.push_back(ms);
  }
  std::sort(step_ms.begin(), step_ms.end());
  r.step_ms_median = step_ms[step_ms.size() / 2];
  r.step_ms_min = step_ms.front();
  r.step_ms_max = step_ms.back();
  r.tok_per_s_median = B * T / (r.step_ms_median / 1e3);
  r.gflops_median = r.flops_per_token * r.tok_per_s_median / 1e9;
  r.state_mb = 4.0 * P * sizeof(float) / (1024.0 * 1024.0);
  r.activations_mb = model->activation_bytes() / (1024.0 * 1024.0);
  r.peak_rss_mb = peak_rss_mb();
  *out = r;
  return Status::Ok();
}

double MeasureGemmGflops(int M, int N, int K, int threads, int repeats) {
  omp_set_num_threads(threads);
  Rng rng(1);
  std::vector<float> a((size_t)M * K), b((size_t)K * N), c((size_t)M * N);
  for (float& x : a) x = (float)rng.normal();
  for (float& x : b) x = (float)rng.normal();
  auto run_once = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    ParallelForChunks(M, [&](int m0, int m1) {
      gemm(false, false, m1 - m0, N, K, 1.0f, a.data() + (size_t)m0 * K, K, b.data(), N, 0.0f, c.data() + (size_t)m0 * N, N);
    });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Half a second of warm-up: caches, threads and the cores' clocks.
  for (double warm = 0; warm < 0.5;) warm += run_once();
  std::vector<double> seconds;
  for (int r = 0; r < repeats; r++) seconds.push_back(run_once());
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * M * N * K / seconds[seconds.size() / 2] / 1e9;
}

std::string EngineBenchResultJson(const EngineBenchResult& r) {
  nlohmann::json j = {
      {"trainer", "dilocod"},
      {"config", r.preset},
      {"threads", r.threads},
      {"n_layer", r.model.n_layer},
      {"n_embd", r.model.n_embd},
      {"n_head", r.model.n_head},
      {"block_size", r.model.block_size},
      {"batch", r.batch},
      {"steps", r.steps},
      {"flops_per_token", r.flops_per_token},
      {"step_ms_median", r.step_ms_median},
      {"step_ms_min", r.step_ms_min},
      {"step_ms_max", r.step_ms_max},
      {"tok_per_s_median", r.tok_per_s_median},
      {"gflops_median", r.gflops_median},
      {"state_mb", r.state_mb},
      {"activations_mb", r.activations_mb},
      {"peak_rss_mb", r.peak_rss_mb},
      {"loss_first", r.loss_first},
      {"loss_last", r.loss_last},
  };
  return j.dump();
}

}  // namespace diloco
