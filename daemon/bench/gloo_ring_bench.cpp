// Throughput of a local ring training the CPU GPT: ranks as threads of this
// process (ThreadCommGroup) or as processes over Gloo (GlooCommGroup, one
// process per rank: start world_size of them with --rank 0..N-1 and one
// --store directory). Every rank trains on its own fixed batch with
// ring_train_step; rank 0 prints one JSON line:
//   {"mode", "world", "batch", "steps", "ms_per_step", "tokens_per_s", "loss", "params_fnv"}
// tokens_per_s counts every rank's tokens (world * batch * block_size per step);
// params_fnv hashes the final parameters, so two runs can be checked equal.
// scripts/bench/gloo_ring.sh runs both modes and prints a table.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/comm/gloo_comm.h"

namespace {

using namespace diloco;

struct Args {
  std::string mode = "threads";
  int world = 2;
  int rank = 0;
  std::string store;
  int batch = 8;
  int steps = 30;
  int warmup = 3;
  int64_t timeout_ms = 60000;
};

struct Result {
  std::string error;
  double seconds = 0.0;
  double loss = 0.0;
  uint64_t fnv = 0;
};

// One rank: warmup steps, a barrier, the timed steps, a barrier.
Result run_rank(LocalComm& comm, const Args& a) {
  Result res;
  BackendOptions options;  // GptConfig's defaults: vocab 256, block 64, 4 layers, n_embd 128, 4 heads
  options.max_batch = a.batch;
  std::unique_ptr<TrainingBackend> backend;
  if (std::string e = CreateBackend("cpu", options, &backend); !e.empty()) return {e};
  backend->init_weights(1);
  const int T = options.model.block_size;
  std::vector<int> tokens((size_t)a.batch * (T + 1)), inputs((size_t)a.batch * T), targets((size_t)a.batch * T);
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(comm.rank() + 1);
  for (int& t : tokens) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = (int)((x >> 33) % (uint64_t)options.model.vocab_size);
  }
  for (int b = 0; b < a.batch; b++)
    for (int t = 0; t < T; t++) {
      inputs[(size_t)b * T + t] = tokens[(size_t)b * (T + 1) + t];
      targets[(size_t)b * T + t] = tokens[(size_t)b * (T + 1) + t + 1];
    }
  const AdamWHyper hp;
  StepStats stats;
  auto step = [&]() -> bool {
    const CommStatus st =
        ring_train_step(*backend, comm, inputs.data(), targets.data(), a.batch, T, hp, /*grad_clip=*/1.0, &stats);
    if (!st.ok()) res.error = st.error;
    return st.ok();
  };
  for (int i = 0; i < a.warmup; i++)
    if (!step()) return res;
  if (CommStatus st = comm.barrier(); !st.ok()) return {st.error};
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; i++)
    if (!step()) return res;
  if (CommStatus st = comm.barrier(); !st.ok()) return {st.error};
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.loss = stats.loss;
  std::vector<float> params(backend->num_params());
  backend->download_params(params.data());
  res.fnv = 1469598103934665603ull;
  for (const unsigned char* p = (const unsigned char*)params.data(),
                            *end = p + params.size() * sizeof(float);
       p != end; p++)
    res.fnv = (res.fnv ^ *p) * 1099511628211ull;
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Local ring throughput: threads or Gloo processes"};
  app.add_option("--mode", a.mode, "threads | gloo")->check(CLI::IsMember({"threads", "gloo"}));
  app.add_option("--world", a.world, "ranks in the ring")->check(CLI::PositiveNumber);
  app.add_option("--rank", a.rank, "gloo: this process's rank");
  app.add_option("--store", a.store, "gloo: a directory every process of the ring shares");
  app.add_option("--batch", a.batch, "sequences per rank and step")->check(CLI::PositiveNumber);
  app.add_option("--steps", a.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps first");
  app.add_option("--timeout-ms", a.timeout_ms, "gloo: per-collective timeout");
  CLI11_PARSE(app, argc, argv);

  Result res;
  if (a.mode == "threads") {
    ThreadCommGroup group(a.world);
    std::vector<Result> results(a.world);
    std::vector<std::thread> threads;
    for (int r = 0; r < a.world; r++)
      threads.emplace_back([&, r] {
        std::unique_ptr<LocalComm> comm = group.comm(r);
        results[r] = run_rank(*comm, a);
      });
    for (auto& t : threads) t.join();
    for (const Result& r : results)
      if (!r.error.empty()) res.error = r.error;
    if (res.error.empty()) res = results[0];
  } else {
    if (a.store.empty()) {
      std::fprintf(stderr, "gloo_ring_bench: --mode gloo needs --store DIR (shared by every process)\n");
      return 2;
    }
    GlooCommOptions o;
    o.ring_name = "bench";
    o.world_size = a.world;
    o.first_rank = a.rank;
    o.local_ranks = 1;
    o.timeout_ms = a.timeout_ms;
    o.store = std::make_shared<DirectoryCommStore>(a.store);
    std::unique_ptr<GlooCommGroup> group;
    if (std::string e = GlooCommGroup::Create(o, &group); !e.empty()) {
      std::fprintf(stderr, "gloo_ring_bench: %s\n", e.c_str());
      return 1;
    }
    std::unique_ptr<LocalComm> comm = group->comm(0);
    res = run_rank(*comm, a);
  }
  if (!res.error.empty()) {
    std::fprintf(stderr, "gloo_ring_bench: %s\n", res.error.c_str());
    return 1;
  }
  if (a.mode == "threads" || a.rank == 0) {
    const double tokens = (double)a.world * a.batch * GptConfig().block_size * a.steps;
    std::printf(
        "{\"mode\":\"%s\",\"world\":%d,\"batch\":%d,\"steps\":%d,\"ms_per_step\":%.3f,\"tokens_per_s\":%.1f,"
        "\"loss\":%.6f,\"params_fnv\":\"%016llx\"}\n",
        a.mode.c_str(), a.world, a.batch, a.steps, 1000.0 * res.seconds / a.steps, tokens / res.seconds, res.loss,
        (unsigned long long)res.fnv);
  }
  return 0;
}
