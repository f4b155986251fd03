// The learner's memory plan (daemon/train/memory_plan.h) against what the engine allocates, and
// `dilococtl plan` against the real process's peak RSS.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "daemon/train/memory_plan.h"
#include "tests/apps/dilococtl_testing.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/shard.h"
#include "tests/text_corpus.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;

RunConfig ConfigOf(ModelConfig model, int batch) {
  RunConfig cfg;
  cfg.model = model;
  cfg.train.batch_size = batch;
  return cfg;
}

using namespace diloco::testing;

fs::path MakeWorkDir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("memory_plan_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "corpus.txt") << testing::NumberedLines(2000);
  std::ofstream(dir / "run.yaml") << "model: {n_layer: 1, n_embd: 16, n_head: 2, block_size: 16}\n"
                                     "data: {corpus: corpus.txt}\n"
                                     "train: {batch_size: 2, steps: 2, warmup_steps: 1, threads: 2}\n"
                                     "eval: {batches: 1}\n";
  return dir;
}

std::string ModelSets(int n_layer, int n_embd, int n_head, int block_size, int batch) {
  return "--set model.n_layer=" + std::to_string(n_layer) + " --set model.n_embd=" + std::to_string(n_embd) +
         " --set model.n_head=" + std::to_string(n_head) + " --set model.block_size=" + std::to_string(block_size) +
         " --set train.batch_size=" + std::to_string(batch);
}

}  // namespace

TEST_CASE("the plan's activations and state are what the CPU engine allocates", "[unit][plan]") {
  const ModelConfig shapes[] = {{1, 16, 2, 16, 256}, {2, 64, 4, 32, 256}, {3, 48, 6, 20, 300}, {4, 128, 4, 64, 256}};
  for (const ModelConfig& m : shapes) {
    for (int batch : {1, 3, 8}) {
      INFO("n_layer " << m.n_layer << " n_embd " << m.n_embd << " block " << m.block_size << " batch " << batch);
      MemoryPlan plan;
      REQUIRE(PlanLearnerMemory(ConfigOf(m, batch), &plan).message() == "");
      CpuBackend backend(BackendOptions{.model = {m.vocab_size, m.block_size, m.n_layer, m.n_embd, m.n_head},
                                        .max_batch = batch});
      const uint64_t n = backend.num_params();
      CHECK(plan.num_params == n);
      CHECK(plan.find("activations")->bytes == backend.activation_bytes());
      CHECK(CpuActivationBytes(m, batch, false) == backend.activation_bytes());
      CHECK(plan.find("params")->bytes == 4 * n);
      CHECK(plan.find("grads")->bytes == 4 * n);
      CHECK(plan.find("moments")->bytes == 8 * n);
      CHECK(plan.find("bf16_copy")->bytes == 0);
      CHECK(plan.find("outer_sync")->bytes == 0);  // one learner: no outer sync
      CHECK(plan.find("codec")->bytes == 0);
      // A checkpoint save copies params and moments to the host next to the batch buffers.
      CHECK(plan.find("workspace")->bytes == 12 * n + 4 * (uint64_t)batch * m.block_size * 4);
    }
  }
}

TEST_CASE("the plan shards, recomputes and adds the outer sync as the design says", "[unit][plan]") {
  RunConfig cfg = ConfigOf({4, 128, 4, 64, 256}, 4);
  MemoryPlan none, zero1, zero2, recompute, synced;
  REQUIRE(PlanLearnerMemory(cfg, &none).ok());
  const uint64_t n = none.num_params;
  cfg.train.ranks = 4;
  cfg.train.hosts = 2;
  cfg.train.shard = ShardMode::kOptimizer;
  REQUIRE(PlanLearnerMemory(cfg, &zero1).ok());
  const uint64_t shard = ShardCounts(n, 8)[0];
  const uint64_t padded = ShardPaddedFloats(n, 8);  // 8 equal shards: the table, then zero pads
  CHECK(padded > n);
  CHECK(zero1.world == 8);
  CHECK(zero1.find("moments")->bytes == 8 * shard);
  CHECK_FALSE(zero1.find("moments")->modelled);  // built on the cpu
  CHECK(zero1.find("grads")->bytes == 4 * padded);
  CHECK(zero1.find("params")->bytes == 4 * padded);
  cfg.train.shard = ShardMode::kGradients;
  REQUIRE(PlanLearnerMemory(cfg, &zero2).ok());
  // The embeddings' bucket and one block's (the largest of ln_f and the blocks).
  const uint64_t block = 12 * 128 * 128 + 13 * 128, embeddings = (256 + 64) * 128;
  CHECK(zero2.find("grads")->bytes == 4 * (shard + embeddings + block));
  CHECK(zero2.find("params")->bytes == 4 * padded);  // the cpu keeps whole fp32 params, padded
  // The host's 4 CPU ranks share its memory: rank 0 and 3 others, which hold no checkpoint copy
  // and only their own batch buffers.
  const uint64_t other = zero2.find("params")->bytes + zero2.find("grads")->bytes + zero2.find("moments")->bytes +
                         zero2.find("activations")->bytes + 2 * 4 * 64 * 4;
  CHECK(zero2.fit_bytes == zero2.total_bytes + 3 * other);

  cfg = ConfigOf({4, 128, 4, 64, 256}, 4);
  cfg.train.recompute = true;
  REQUIRE(PlanLearnerMemory(cfg, &recompute).ok());
  const uint64_t N = 4 * 64, NC = N * 128;
  const uint64_t per_layer = (18 * NC + 4 * N + 4 * 4 * 64 * 64) * 4;
  CHECK(none.find("activations")->bytes - recompute.find("activations")->bytes == 3 * per_layer - 4 * NC * 4);

  cfg = ConfigOf({4, 128, 4, 64, 256}, 4);
  cfg.sync.learners = 2;
  REQUIRE(PlanLearnerMemory(cfg, &synced).ok());
  CHECK(synced.outer_sync);
  CHECK(synced.find("outer_sync")->bytes > 20 * n);  // 16 B backend + 4 B host mirror + scratch
  CHECK(synced.find("outer_sync")->bytes < 24 * n);
  CHECK(synced.find("codec")->bytes > 0);
  // Sharded, every rank keeps ~1/world of the 16 B/param; rank 0 also the 4 B host mirror.
  cfg.train.ranks = 4;
  cfg.train.shard = ShardMode::kOptimizer;
  MemoryPlan sharded_sync;
  REQUIRE(PlanLearnerMemory(cfg, &sharded_sync).ok());
  CHECK(sharded_sync.find("outer_sync")->bytes > 8 * n);   // 16 / 4 + 4
  CHECK(sharded_sync.find("outer_sync")->bytes < synced.find("outer_sync")->bytes / 2);
  cfg.train.ranks = 1;
  cfg.train.shard = ShardMode::kNone;
  cfg.sync.mode = SyncMode::kDdp;
  REQUIRE(PlanLearnerMemory(cfg, &synced).ok());
  CHECK_FALSE(synced.outer_sync);
}

// Rings whose sizes do not divide the table: the padded buffers and the shards the plan counts
// are what a sharded CpuBackend of rank 0 holds.
TEST_CASE("the sharded plan's parameters, gradients and shard are the sharded CPU engine's", "[unit][plan]") {
  const ModelConfig m{2, 64, 4, 32, 256};
  for (int ranks : {3, 5}) {
    for (ShardMode mode : {ShardMode::kOptimizer, ShardMode::kGradients}) {
      CAPTURE(ranks, kShardModeNames[(int)mode]);
      RunConfig cfg = ConfigOf(m, 2);
      cfg.train.ranks = ranks;
      cfg.train.shard = mode;
      MemoryPlan plan;
      REQUIRE(PlanLearnerMemory(cfg, &plan).ok());
      BackendOptions o{.model = {m.vocab_size, m.block_size, m.n_layer, m.n_embd, m.n_head}, .max_batch = 2};
      o.shard = mode;
      o.rank = 0;
      o.world = ranks;
      CpuBackend backend(o);
      const uint64_t n = backend.num_params();
      REQUIRE(ShardPaddedFloats(n, ranks) > n);  // the pads are real here
      CHECK(plan.find("params")->bytes == backend.allocated().params);
      CHECK(plan.find("params")->bytes == 4 * ShardPaddedFloats(n, ranks));
      CHECK(plan.find("moments")->bytes == 8 * backend.optimizer_range().count);
      if (mode == ShardMode::kOptimizer) {
        CHECK(plan.find("grads")->bytes == backend.allocated().grads);
      } else {
        // The shard, and the buckets a step opens (the embeddings' and the largest block's).
        const uint64_t C = 64, embeddings = (256 + 32) * C, block = 12 * C * C + 13 * C;
        CHECK(plan.find("grads")->bytes == 4 * (backend.optimizer_range().count + embeddings + block));
      }
    }
  }
}

TEST_CASE("the cuda plan: 18 B/param unsharded, the sharded rows modelled", "[unit][plan]") {
  RunConfig cfg = ConfigOf({40, 5120, 40, 2048, 50257}, 1);
  cfg.train.device = "cuda";
  cfg.train.ranks = 8;
  cfg.sync.learners = 8;
  cfg.sync.fragments = 8;
  MemoryPlan plan;
  REQUIRE(PlanLearnerMemory(cfg, &plan).ok());
  const uint64_t n = plan.num_params;
  CHECK(n > 12'500'000'000ULL);
  CHECK(plan.find("params")->bytes + plan.find("bf16_copy")->bytes + plan.find("grads")->bytes +
            plan.find("moments")->bytes ==
        18 * n);
  CHECK(plan.find("outer_sync")->bytes >= 16 * n);
  CHECK_FALSE(plan.find("moments")->modelled);
  cfg.train.shard = ShardMode::kGradients;
  REQUIRE(PlanLearnerMemory(cfg, &plan).ok());
  const uint64_t shard = ShardCounts(n, 8)[0];
  // The whole fp32 master stays on every rank (the CUDA backend), padded to 8 equal shards.
  CHECK(plan.find("params")->bytes == 4 * ShardPaddedFloats(n, 8));
  CHECK(plan.find("bf16_copy")->bytes == 2 * n);
  CHECK(plan.find("moments")->bytes == 8 * shard);
  // The shard, the embeddings' bucket and two blocks' (grad_buckets.h double-buffers them).
  const uint64_t C = 5120, embeddings = (50257 + 2048) * C, block = 12 * C * C + 13 * C;
  CHECK(plan.find("grads")->bytes == 4 * (shard + embeddings + 2 * block));
  CHECK(plan.find("moments")->modelled);
  CHECK(plan.find("outer_sync")->modelled);
  // A larger batch never fits in less memory.
  CHECK(LargestBatchThatFits(cfg, plan.total_bytes) >= 1);
  CHECK(LargestBatchThatFits(cfg, plan.total_bytes / 2) == 0);
}

TEST_CASE("the cuda plan with train.outer_state host: 16 B/param of the GPU's part in pinned host memory",
          "[unit][plan]") {
  RunConfig cfg = ConfigOf({12, 768, 12, 1024, 50257}, 4);
  cfg.train.device = "cuda";
  cfg.sync.learners = 4;
  cfg.sync.fragments = 4;
  MemoryPlan on_device, on_host;
  REQUIRE(PlanLearnerMemory(cfg, &on_device).ok());
  cfg.train.outer_state = OuterStatePlace::kHost;
  REQUIRE(PlanLearnerMemory(cfg, &on_host).ok());
  const uint64_t n = on_device.num_params;
  CHECK(on_device.total_bytes - on_host.total_bytes == 16 * n);
  CHECK(on_host.host_total_bytes - on_device.host_total_bytes == 16 * n);
  CHECK(on_host.find("outer_sync")->modelled);
  bool pinned_row = false;
  for (const PlanComponent& h : on_host.host) pinned_row |= h.key == "outer_sync" && h.bytes == 16 * n;
  CHECK(pinned_row);
  // Sharded over 4 ranks: each rank pins its part only.
  cfg.train.ranks = 4;
  cfg.train.shard = ShardMode::kGradients;
  REQUIRE(PlanLearnerMemory(cfg, &on_host).ok());
  for (const PlanComponent& h : on_host.host)
    if (h.key == "outer_sync") CHECK(h.bytes == 16 * ShardCounts(n, 4)[0]);
}

TEST_CASE("dilococtl plan: planned total within 10% of the measured peak RSS on the cpu", "[e2e][plan]") {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer adds shadow memory (1/8 of what is touched), redzones and a quarantine to the
  // process: its RSS is not the engine's. Measured in the plain build only.
  WARN("skipped under AddressSanitizer: peak RSS includes the sanitizer's own memory");
  return;
#endif
  const fs::path dir = MakeWorkDir("rss");
  const std::string common = " --set train.steps=2 --set eval.batches=1 --set train.threads=2";
  // The process's fixed overhead (binary, libraries, corpus, allocator, threads), which the plan
  // does not model: the peak RSS of a tiny model less its (tiny) plan.
  Result r = Dilococtl(dir, "train run.yaml --out run0 --json" + common);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const double tiny_rss_mb = LastLineJson(r.out)["peak_rss_mb"].get<double>();
  r = Dilococtl(dir, "plan run.yaml --json");
  REQUIRE(r.exit_code == 0);
  const double baseline_mb = tiny_rss_mb - LastLineJson(r.out)["total_bytes"].get<double>() / (1 << 20);
  INFO("baseline " << baseline_mb << " MiB");
  CHECK(baseline_mb > 0);
  fs::remove_all(dir / "run0");

  struct Shape {
    int n_layer, n_embd, n_head, block_size, batch;
    const char* ring;  // extra --set for the learner's ring
  };
  // About 25M, 42M and 79M parameters (the model dominates the baseline); the first two with
  // activations of a few hundred MiB. The last: two ranks sharing the process, ZeRO-2 and recompute
  // (the plan's fit_bytes counts both ranks).
  const Shape shapes[] = {{8, 512, 8, 64, 4, ""},
                          {6, 768, 12, 128, 4, ""},
                          {4, 1280, 20, 128, 2, ""},
                          {6, 768, 12, 128, 4, " --set train.ranks=2 --set train.shard=gradients --set train.recompute=true"}};
  int i = 0;
  for (const Shape& s : shapes) {
    const std::string sets = ModelSets(s.n_layer, s.n_embd, s.n_head, s.block_size, s.batch) + s.ring;
    r = Dilococtl(dir, "plan run.yaml --json " + sets);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const nlohmann::json plan = LastLineJson(r.out);
    const std::string run = "run" + std::to_string(++i);
    r = Dilococtl(dir, "train run.yaml --out " + run + " --json " + sets + common);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const double measured_mb = LastLineJson(r.out)["peak_rss_mb"].get<double>();
    const double planned_mb = plan["fit_bytes"].get<double>() / (1 << 20) + baseline_mb;
    const double error = std::abs(planned_mb - measured_mb) / measured_mb;
    // The figures the issue asks for: printed with -s.
    std::printf("plan vs RSS: %.1fM params, n_layer %d n_embd %d T %d B %d%s: planned %.0f MiB (model %.0f + "
                "baseline %.0f), measured %.0f MiB, error %.1f%%\n",
                plan["num_params"].get<double>() / 1e6, s.n_layer, s.n_embd, s.block_size, s.batch, s.ring, planned_mb,
                planned_mb - baseline_mb, baseline_mb, measured_mb, 100 * error);
    INFO("planned " << planned_mb << " MiB, measured " << measured_mb << " MiB");
    CHECK(error < 0.10);
    fs::remove_all(dir / run);
  }
  fs::remove_all(dir);
}

TEST_CASE("dilococtl plan refuses bad input (2) and a plan that does not fit (1)", "[e2e][plan]") {
  const fs::path dir = MakeWorkDir("bad");
  Result r = Dilococtl(dir, "plan run.yaml --set train.shards=optimizer");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("train.shards") != std::string::npos);
  r = Dilococtl(dir, "plan run.yaml --set train.shard=optimizer");  // one rank: nothing to shard over
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("train.shard") != std::string::npos);
  r = Dilococtl(dir, "plan run.yaml --device-memory -1");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--device-memory") != std::string::npos);

  // About 0.8M parameters: 22 MiB > 0.001 GiB.
  const std::string bigger = " --set model.n_layer=4 --set model.n_embd=128";
  r = Dilococtl(dir, "plan run.yaml --device-memory 0.001" + bigger);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("does not fit") != std::string::npos);
  CHECK(r.err.find("the largest part is") != std::string::npos);
  CHECK(r.err.find("train.recompute=true") != std::string::npos);
  CHECK(r.out.find("does NOT fit") != std::string::npos);
  r = Dilococtl(dir, "plan run.yaml --device-memory 0.001 --json" + bigger);
  CHECK(r.exit_code == 1);
  CHECK(LastLineJson(r.out)["fits"] == false);

  r = Dilococtl(dir, "plan run.yaml");  // the default for cpu: this machine's memory
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("MemTotal") != std::string::npos);
  CHECK(r.out.find("parameters (fp32)") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("configs/gpt-12b.yaml fits an H200 per rank sharded, not unsharded", "[e2e][plan]") {
  const fs::path config = fs::path(DILOCO_SOURCE_DIR) / "configs/gpt-12b.yaml";
  RunConfig cfg;
  REQUIRE(LoadRunConfig(config.string(), {}, &cfg).message() == "");
  CHECK(cfg.model == ModelConfig{40, 5120, 40, 2048, 50257});
  CHECK(cfg.data.format == DataFormat::kTokens);
  CHECK(cfg.train.device == "cuda");
  CHECK(cfg.train.hosts * cfg.train.ranks == 16);
  CHECK(cfg.train.shard == ShardMode::kGradients);
  CHECK(cfg.train.recompute);

  const fs::path dir = MakeWorkDir("12b");
  Result r = Dilococtl(dir, "plan '" + config.string() + "' --device-memory 141 --json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  nlohmann::json plan = LastLineJson(r.out);
  CHECK(plan["fits"] == true);
  CHECK(plan["max_batch"].get<int>() >= cfg.train.batch_size);
  CHECK(plan["num_params"].get<double>() > 12.5e9);

  r = Dilococtl(dir, "plan '" + config.string() + "' --device-memory 141 --json --set train.shard=none");
  CHECK(r.exit_code == 1);
  plan = LastLineJson(r.out);
  CHECK(plan["fits"] == false);
  CHECK(r.err.find("train.shard=gradients") != std::string::npos);
  fs::remove_all(dir);
}

}  // namespace diloco
