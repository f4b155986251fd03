#include <cstdio>

#include "daemon/bench/engine_bench.h"
#include "daemon/ctl/commands.h"

namespace diloco {

int RunBenchEngineCommand(const BenchEngineCommand& cmd) {
  EngineBenchResult r;
  const Status st = RunEngineBench({cmd.preset, cmd.threads, cmd.steps, cmd.warmup}, &r);
  if (!st.ok()) {
    std::fprintf(stderr, "dilococtl bench engine: %s\n", st.message().c_str());
    return 2;
  }
  if (cmd.json) {
    std::printf("%s\n", EngineBenchResultJson(r).c_str());
  } else {
    std::printf("%-8s thr=%d step median %.2f ms (min %.2f max %.2f, n=%d) tok/s %.0f %.1f GFLOP/s "
                "state %.1f MiB activations %.1f MiB peak RSS %.1f MiB loss %.3f->%.3f\n",
                r.preset.c_str(), r.threads, r.step_ms_median, r.step_ms_min, r.step_ms_max, r.steps,
                r.tok_per_s_median, r.gflops_median, r.state_mb, r.activations_mb, r.peak_rss_mb, r.loss_first,
                r.loss_last);
  }
  return 0;
}

int RunBenchGemmCommand(const BenchGemmCommand& cmd) {
  if (cmd.threads < 1 || cmd.m < 1 || cmd.n < 1 || cmd.k < 1) {
    std::fprintf(stderr, "dilococtl bench gemm: sizes and --threads must be at least 1\n");
    return 2;
  }
  const double gflops = MeasureGemmGflops(cmd.m, cmd.n, cmd.k, cmd.threads);
  if (cmd.json) {
    std::printf("{\"m\": %d, \"n\": %d, \"k\": %d, \"threads\": %d, \"gflops\": %.2f}\n", cmd.m, cmd.n, cmd.k,
                cmd.threads, gflops);
  } else {
    std::printf("sgemm %dx%dx%d thr=%d: %.1f GFLOP/s\n", cmd.m, cmd.n, cmd.k, cmd.threads, gflops);
  }
  return 0;
}

}  // namespace diloco
