// dilococtl plan: prints the learner's per-rank memory plan (daemon/train/memory_plan.h) as a table
// or one JSON object, and whether it fits a device of --device-memory GiB.
#include "apps/dilococtl/plan_command.h"

#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "daemon/config/run_config.h"
#include "daemon/control/job_limits.h"
#include "daemon/train/memory_plan.h"

namespace diloco {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kH200GiB = 141;  // the default device for cuda

struct DeviceMemory {
  uint64_t bytes = 0;
  std::string source;  // what the figure is
};

int Usage(const std::string& message) {
  std::fprintf(stderr, "dilococtl plan: %s\n", message.c_str());
  return 2;
}

std::string Gib(uint64_t bytes) {
  char buf[32];
  if (bytes < kGiB / 10)
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / kGiB);
  return buf;
}

// What to change when the plan does not fit, the largest component first.
std::string Advice(const RunConfig& cfg, const MemoryPlan& plan, int max_batch) {
  const TrainConfig& tc = cfg.train;
  const PlanComponent& big = plan.largest();
  std::vector<std::string> steps;
  const auto shard_advice = [&] {
    if (tc.shard == ShardMode::kGradients) return;
    if (plan.world > 1)
      steps.push_back("set train.shard=gradients (ZeRO-2: moments and gradients 1/" +
                      std::to_string(plan.world) + " per rank)");
    else
      steps.push_back("shard the state over more ranks: train.ranks or train.hosts > 1 with train.shard=gradients");
  };
  const auto ranks_advice = [&] {
    if (tc.shard != ShardMode::kNone)
      steps.push_back("add ranks or hosts (train.ranks, train.hosts: now " + std::to_string(plan.world) +
                      " ranks) to split the sharded state further");
  };
  const auto activation_advice = [&] {
    if (!tc.recompute) steps.push_back("set train.recompute=true (activations of one block instead of all)");
    if (max_batch > 0)
      steps.push_back("lower train.batch_size to " + std::to_string(max_batch) + " or less");
    else
      steps.push_back("a smaller train.batch_size alone is not enough (batch 1 does not fit)");
  };
  const auto outer_advice = [&] {
    if (plan.cuda && plan.outer_sync && tc.outer_state == OuterStatePlace::kDevice)
      steps.push_back("set train.outer_state=host (the outer-sync state's 16 B a parameter of each rank's part to "
                      "pinned host memory)");
  };
  if (big.key == "activations") {
    activation_advice();
    shard_advice();
    ranks_advice();
  } else if (big.key == "outer_sync") {
    outer_advice();
    shard_advice();
    ranks_advice();
    activation_advice();
  } else {
    shard_advice();
    ranks_advice();
    activation_advice();
  }
  std::string text;
  for (size_t i = 0; i < steps.size(); i++) text += (i ? "; " : "") + steps[i];
  return text;
}

nlohmann::json ComponentsJson(const std::vector<PlanComponent>& components, uint64_t params) {
  nlohmann::json list = nlohmann::json::array();
  for (const PlanComponent& c : components)
    list.push_back({{"key", c.key},
                    {"name", c.name},
                    {"bytes", c.bytes},
                    {"bytes_per_param", (double)c.bytes / params},
                    {"detail", c.detail},
                    {"modelled", c.modelled}});
  return list;
}

nlohmann::json InputsJson(const std::string& path, const RunConfig& cfg, const MemoryPlan& plan) {
  const TrainConfig& tc = cfg.train;
  return {{"config", path},
          {"device", tc.device},
          {"n_layer", cfg.model.n_layer},
          {"n_head", cfg.model.n_head},
          {"n_embd", cfg.model.n_embd},
          {"block_size", cfg.model.block_size},
          {"vocab_size", cfg.model.vocab_size},
          {"batch_size", tc.batch_size},
          {"hosts", tc.hosts},
          {"ranks", tc.ranks},
          {"world", plan.world},
          {"shard", std::string(ToString(tc.shard))},
          {"recompute", tc.recompute},
          {"outer_state", std::string(ToString(tc.outer_state))},
          {"sync_mode", std::string(ToString(cfg.sync.mode))},
          {"learners", cfg.sync.learners},
          {"fragments", EffectiveFragments(cfg.sync)},
          {"outer_sync", plan.outer_sync}};
}

void PrintTable(const std::string& path, const RunConfig& cfg, const MemoryPlan& plan, const DeviceMemory& dev,
                bool fits, int max_batch) {
  const TrainConfig& tc = cfg.train;
  const double n = (double)plan.num_params;
  std::printf("%s: GPT of %.3f%s parameters (n_layer %d, n_embd %d, n_head %d, block_size %d, vocab %d)\n",
              path.c_str(), n >= 1e9 ? n / 1e9 : n / 1e6, n >= 1e9 ? "B" : "M", cfg.model.n_layer, cfg.model.n_embd, cfg.model.n_head, cfg.model.block_size,
              cfg.model.vocab_size);
  std::printf("%s, ring of %d ranks (%d hosts x %d), shard %s, recompute %s, batch %d per rank, outer sync %s\n",
              tc.device.c_str(), plan.world, tc.hosts, tc.ranks, std::string(ToString(tc.shard)).c_str(),
              tc.recompute ? "on" : "off", tc.batch_size,
              plan.outer_sync ? (std::string(ToString(cfg.sync.mode)) + ", " + std::to_string(cfg.sync.learners) +
                                 " learners, " + std::to_string(EffectiveFragments(cfg.sync)) + " fragments" +
                                 (tc.outer_state == OuterStatePlace::kHost ? ", its state in host memory" : ""))
                                    .c_str()
                              : "none");
  std::printf("\nper rank (rank 0, the worst)%s:\n", plan.cuda ? ", GPU memory" : "");
  std::printf("  %-28s %16s %12s %9s\n", "component", "bytes", "GiB", "B/param");
  bool any_modelled = false;
  for (const PlanComponent& c : plan.components) {
    any_modelled = any_modelled || c.modelled;
    std::printf("  %-28s %16llu %12.3f %9.3f%s\n", (c.name + (c.modelled ? " *" : "")).c_str(),
                (unsigned long long)c.bytes, c.bytes / kGiB, c.bytes / n, "");
  }
  std::printf("  %-28s %16llu %12.3f %9.3f\n", "total", (unsigned long long)plan.total_bytes,
              plan.total_bytes / kGiB, plan.total_bytes / n);
  if (any_modelled)
    std::printf("  * modelled (%s)\n", plan.cuda ? "not yet run on a GPU" : "follows the design; not yet built on the cpu");
  if (!plan.host.empty()) {
    std::printf("\nrank 0's host memory (not on the GPU): %s\n", Gib(plan.host_total_bytes).c_str());
    for (const PlanComponent& c : plan.host)
      std::printf("  %-28s %16llu %12.3f\n", c.name.c_str(), (unsigned long long)c.bytes, c.bytes / kGiB);
  }
  std::printf("\n");
  if (plan.fit_bytes != plan.total_bytes)
    std::printf("the host's %d ranks together: %s\n", tc.ranks, Gib(plan.fit_bytes).c_str());
  std::printf("device memory: %s (%s): %s\n", Gib(dev.bytes).c_str(), dev.source.c_str(),
              fits ? "fits" : "does NOT fit");
  std::printf("largest train.batch_size that fits: %d\n", max_batch);
  for (const std::string& note : plan.notes) std::printf("note: %s\n", note.c_str());
}

}  // namespace

int RunPlanCommand(const PlanCommand& cmd) {
  RunConfig cfg;
  if (Status st = LoadRunConfig(cmd.config_path, cmd.overrides, &cfg); !st.ok()) return Usage(st.message());
  MemoryPlan plan;
  if (Status st = PlanLearnerMemory(cfg, &plan); !st.ok()) return Usage(st.message());

  DeviceMemory dev;
  if (!std::isnan(cmd.device_memory_gib)) {
    if (!std::isfinite(cmd.device_memory_gib) || cmd.device_memory_gib <= 0)
      return Usage("--device-memory " + std::to_string(cmd.device_memory_gib) +
                   ": give the device's memory in GiB, a number > 0 (e.g. 141 for an H200)");
    dev.bytes = (uint64_t)(cmd.device_memory_gib * kGiB);
    dev.source = "--device-memory";
  } else if (plan.cuda) {
    dev.bytes = (uint64_t)(kH200GiB * kGiB);
    dev.source = "default for cuda: an H200, 141 GiB";
  } else {
    dev.bytes = MachineMemoryBytes();
    if (dev.bytes == 0) return Usage("cannot read MemTotal from /proc/meminfo: pass --device-memory GiB");
    dev.source = "default for cpu: this machine's MemTotal";
  }
  const bool fits = plan.fit_bytes <= dev.bytes;
  const int max_batch = LargestBatchThatFits(cfg, dev.bytes);
  const PlanComponent& big = plan.largest();

  if (cmd.json) {
    nlohmann::json j = {{"inputs", InputsJson(cmd.config_path, cfg, plan)},
                        {"num_params", plan.num_params},
                        {"components", ComponentsJson(plan.components, plan.num_params)},
                        {"total_bytes", plan.total_bytes},
                        {"bytes_per_param", (double)plan.total_bytes / plan.num_params},
                        {"bytes_per_param_without_activations",
                         (double)(plan.total_bytes - plan.find("activations")->bytes) /
                             plan.num_params},
                        {"fit_bytes", plan.fit_bytes},
                        {"device_memory_bytes", dev.bytes},
                        {"device_memory_source", dev.source},
                        {"fits", fits},
                        {"max_batch", max_batch},
                        {"largest", big.key},
                        {"notes", plan.notes}};
    if (plan.cuda) {
      j["host"] = ComponentsJson(plan.host, plan.num_params);
      j["host_total_bytes"] = plan.host_total_bytes;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    PrintTable(cmd.config_path, cfg, plan, dev, fits, max_batch);
  }
  if (fits) return 0;
  std::fprintf(stderr,
               "dilococtl plan: does not fit: %s per %s > %s (%s); the largest part is %s (%s, %.1f B/param). To "
               "fit: %s\n",
               Gib(plan.fit_bytes).c_str(), plan.cuda ? "GPU" : "host", Gib(dev.bytes).c_str(), dev.source.c_str(),
               big.name.c_str(), Gib(big.bytes).c_str(), (double)big.bytes / plan.num_params,
               Advice(cfg, plan, max_batch).c_str());
  return 1;
}

}  // namespace diloco
