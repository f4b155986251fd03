// Training-step throughput of the CPU engine on random byte tokens, on the
// same model shapes as the PyTorch peer (scripts/bench/engine.sh).
#pragma once

#include <string>

#include "daemon/util/status.h"
#include "kernels/gpt.h"

namespace diloco {

struct EngineBenchOptions {
  std::string preset = "small";  // tiny | small | gpt2ish
  int threads = 1;
  int steps = 0;   // timed steps; 0 = the preset's default
  int warmup = 0;  // untimed steps first; 0 = the preset's default
};

struct EngineBenchResult {
  std::string preset;
  GptConfig model;
  int batch = 0, threads = 0, steps = 0;
  double flops_per_token = 0;  // nanoGPT's estimate: 6 N + 12 L C T
  double step_ms_median = 0, step_ms_min = 0, step_ms_max = 0;
  double tok_per_s_median = 0, gflops_median = 0;
  double state_mb = 0;        // params + grads + AdamW m and v
  double activations_mb = 0;  // activations and their gradient scratch
  double peak_rss_mb = 0;
  double loss_first = 0, loss_last = 0;
};

Status RunEngineBench(const EngineBenchOptions& options, EngineBenchResult* out);

// GFLOP/s of the engine's GEMM (OpenBLAS sgemm, rows split across threads as
// the engine does) on an (M,K) x (K,N) product: the ceiling the engine's
// GFLOP/s is compared against. Median of `repeats` runs.
double MeasureGemmGflops(int M, int N, int K, int threads, int repeats = 20);
std::string EngineBenchResultJson(const EngineBenchResult& r);

}  // namespace diloco
