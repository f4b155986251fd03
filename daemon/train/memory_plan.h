// The per-rank memory of a learner, planned from its run config without allocating the model
// (`dilococtl plan CONFIG`): what each rank of the learner's ring holds, component by component,
// so a user knows before launching whether a model fits a device.
//
// Every figure follows what the engine allocates (read the code named in each component's detail):
//   cpu   kernels/gpt.cpp (Gpt: fp32 params, grads, one activation buffer), kernels/optimizer.h
//         (AdamW m, v at the first step), kernels/cpu/cpu_backend.cpp (outer-sync state and its
//         scratch), daemon/train/learner.cpp (host mirror of the bases, codec buffers),
//         daemon/train/checkpoint.cpp (a save copies params and moments to the host).
//   cuda  kernels/cuda/cuda_backend.cpp (fp32 master, grads, m, v, bf16 copy, bf16 activations,
//         backward scratch, cuBLASLt workspace, outer-sync state on the device).
// Sharding (train.shard) and recompute (train.recompute) follow the design where the engine does
// not run them yet; those components say so (modelled = true):
//   optimizer  moments of the rank's shard only (ShardCounts); the fp32 parameters (and the
//              gradients) in a buffer padded to world equal shards (ShardPaddedFloats: the
//              sharded step's collectives move equal parts, kernels/shard.h).
//   gradients  as optimizer, and the gradient buffer holds the rank's shard plus the buckets open
//              at once: wte + wpe and one of ln_f / a block on the cpu, two of them on cuda
//              (kernels/cuda/grad_buckets.h double-buffers them to overlap the reduce-scatters).
//   cuda       the bf16 copy stays whole (parameters are all-gathered in bf16), the outer-sync
//              state is 16 B x shard (each rank keeps its part).
//   recompute  per-layer activation slots for one layer only, plus each layer's input residual
//              stream (B x T x C per layer).
// The outer-sync state exists when the run has an outer sync (sync.mode diloco, streaming or
// decoupled with sync.learners > 1); on the cpu rank 0 of the ring holds it for the whole model,
// so the plan reports rank 0, the worst rank. Fixed process overhead (binary, libraries, corpus,
// allocator, thread stacks; on cuda the CUDA context and NCCL) is not modelled: see notes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"

namespace diloco {

struct PlanComponent {
  std::string key;     // JSON name: "params", "bf16_copy", "grads", "moments", ...
  std::string name;    // for the table: "parameters (fp32)"
  uint64_t bytes = 0;  // on rank 0 (the worst rank)
  std::string detail;  // how it is sized
  bool modelled = false;  // the engine does not allocate it this way yet (sharding, recompute, cuda shards)
};

struct MemoryPlan {
  bool cuda = false;
  int world = 1;            // ranks of the learner's ring: train.hosts x train.ranks
  uint64_t num_params = 0;
  bool outer_sync = false;  // the run has an outer sync (its state is planned)
  // What counts against the device: on cpu everything the process allocates that scales; on cuda
  // the GPU's memory.
  std::vector<PlanComponent> components;
  uint64_t total_bytes = 0;
  // What must fit the device: total_bytes on cuda (one GPU); on cpu the host's train.ranks ranks
  // together (they share its memory): rank 0's total + the other ranks' (no outer sync, no
  // checkpoint copy there).
  uint64_t fit_bytes = 0;
  // cuda only: what rank 0's host process also holds (not counted against the GPU), with every
  // rank's pinned outer-sync state under train.outer_state: host.
  std::vector<PlanComponent> host;
  uint64_t host_total_bytes = 0;
  std::vector<std::string> notes;

  const PlanComponent* find(const std::string& key) const;
  // The component with the most bytes.
  const PlanComponent& largest() const;
};

// The plan of cfg at its train.batch_size. Errors (a shape the partition or the shard rule
// refuses) name the key to change.
Status PlanLearnerMemory(const RunConfig& cfg, MemoryPlan* out);

// The largest train.batch_size whose plan totals at most device_bytes (everything else as in cfg);
// 0 when even a batch of 1 does not fit.
int LargestBatchThatFits(const RunConfig& cfg, uint64_t device_bytes);

// The activation bytes Gpt allocates for max_batch sequences (Gpt::activation_bytes), without
// allocating: recompute keeps one layer's slots plus each layer's input residual stream.
uint64_t CpuActivationBytes(const ModelConfig& model, int max_batch, bool recompute);

}  // namespace diloco
