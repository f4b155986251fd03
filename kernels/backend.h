// The training backend: what a learner needs from a compute engine, so the
// learner and syncer code is the same on CPU and GPU sites (DESIGN.md §6).
//
//   "cpu"    CpuBackend (kernels/cpu/cpu_backend.cpp): the fp32 Gpt and
//            train_step of this folder, bit for bit.
//   "cuda"   CudaBackend (kernels/cuda/cuda_backend.h): hand-written CUDA
//            kernels + cuBLASLt, bf16 weights and activations, fp32 master
//            weights, AdamW moments and gradients. "cuda:N" picks device N.
//
// Parameters, gradients and AdamW moments use the tensor table layout of
// gpt_tensor_table(config) on every backend, so fragments (ranges of the
// table) move between backends and the wire as plain float ranges.
//
// One inner step on a site with a local ring (ring_train_step below):
//   loss = forward_backward(batch)        gradient of this rank's mean loss
//   comm.all_reduce(grad_buffer(), mean)  the ring (LocalComm)
//   apply_update(loss, hp, clip)          global-norm clip + AdamW
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/comm/comm_store.h"
#include "kernels/comm/local_comm.h"
#include "kernels/gpt.h"
#include "kernels/optimizer.h"
#include "kernels/outer_place.h"
#include "kernels/shard.h"
#include "kernels/sync_ops.h"
#include "kernels/tensor_table.h"
#include "kernels/train_step.h"

namespace diloco {

// A range of the flat parameter buffer, in floats.
struct ParamRange {
  size_t offset = 0;
  size_t count = 0;
};

// What a replay fold takes as θ_included (kernels/sync_ops.h fold): θ_p as of the learner's delta
// that the Global includes, or the base before this Global (the Global holds none of our work).
enum class FoldIncluded { kAtSend, kPreviousBase };

struct BackendOptions {
  GptConfig model;
  int max_batch = 1;  // sequences per forward_backward (activation memory scales with it)
  bool recompute = false;  // block-level activation recompute (GptOptions::recompute)
  // A rank of a sharded ring keeps rank's part (ShardCounts(num_params, world), kernels/shard.h)
  // of the state that shard says; ring_train_step then runs sharded_train_step.
  ShardMode shard = ShardMode::kNone;
  int rank = 0;
  int world = 1;
  // Where the sync ops keep their state (kernels/outer_place.h); a GPU backend's choice.
  OuterStatePlace outer_state = OuterStatePlace::kDevice;
};

class TrainingBackend {
 public:
  virtual ~TrainingBackend() = default;

  // "cpu" or "cuda:0 NVIDIA H200 (...)": for logs.
  virtual std::string name() const = 0;
  virtual const GptConfig& config() const = 0;
  virtual const TensorTable& table() const = 0;
  size_t num_params() const { return table().total_numel(); }

  // fp32 parameters (the master copy) in table layout: count values at
  // offset. Uploading also refreshes any low-precision copy.
  virtual void upload_params(const float* host, size_t offset, size_t count) = 0;
  virtual void download_params(float* host, size_t offset, size_t count) const = 0;
  void upload_params(const float* host) { upload_params(host, 0, num_params()); }
  void download_params(float* host) const { download_params(host, 0, num_params()); }
  // GPT-2 init (gpt_init_params) of every parameter.
  void init_weights(uint64_t seed);
  // The fp32 master parameters themselves (num_params floats, table layout,
  // in grad_memory()): what a local ring broadcasts from rank 0 when the
  // outer sync changed them. After writing a range there, call
  // params_written so any low-precision copy follows.
  virtual float* param_buffer() = 0;
  virtual void params_written(size_t offset, size_t count) = 0;
  // The floats param_buffer() (and a whole grad_buffer()) hold: num_params, or on a sharded ring
  // ShardPaddedFloats(num_params, world), the pads past the table zeros (kernels/shard.h) so that
  // the sharded step's collectives move equal parts.
  virtual size_t param_buffer_floats() const { return num_params(); }

  // AdamW moments and step (checkpoints, a learner that rejoins), in table layout. A rank of a
  // sharded ring keeps only optimizer_range(): download writes that range of out->m and out->v
  // (sizing them to num_params first when they are not), upload takes that range of state, so
  // each rank of a ring downloading into one state gathers it whole (LocalRing::Download).
  virtual void download_optimizer(AdamWState* out) const = 0;
  virtual void upload_optimizer(const AdamWState& state) = 0;
  // The parameters whose AdamW state this rank keeps and updates: all of them unsharded.
  virtual ParamRange optimizer_range() const { return {0, num_params()}; }
  virtual ShardMode shard() const { return ShardMode::kNone; }

  // Runs forward and backward on inputs/targets (B,T) (host memory) and
  // OVERWRITES grad_buffer() with the gradient of the batch's mean loss,
  // which it returns. B <= max_batch, T <= block_size.
  virtual double forward_backward(const int* inputs, const int* targets, int B, int T) = 0;
  // The gradient buffer (num_params floats, table layout) in grad_memory():
  // what the local ring all-reduces between forward_backward and apply_update.
  virtual float* grad_buffer() = 0;
  virtual MemorySpace grad_memory() const = 0;
  virtual void download_grads(float* host) const = 0;  // for tests and reports
  // Global-norm clipping (grad_clip <= 0: off) and one AdamW step from the
  // gradient buffer, exactly as train_step() (kernels/train_step.h): nothing
  // changes and applied is false when the loss or the norm is not finite.
  virtual StepStats apply_update(double loss, const AdamWHyper& hp, double grad_clip) = 0;

  // One inner step of a rank of a sharded ring (shard() != kNone; ring_train_step calls it):
  // the loss averaged over the ring first (a non-finite mean skips the step on every rank),
  // backward, the gradients reduce-scattered (all at once for kOptimizer, bucket by bucket as
  // backward finishes them for kGradients), the global norm from the ranks' chunk sums, clip +
  // AdamW on this rank's shard, and the parameters all-gathered. Every rank ends with the
  // parameters, bit for bit, of the unsharded ring.
  virtual CommStatus sharded_train_step(LocalComm& comm, const int* inputs, const int* targets, int B, int T,
                                        const AdamWHyper& hp, double grad_clip, StepStats* stats);

  // One whole step on one rank: forward_backward + apply_update.
  StepStats train_step(const int* inputs, const int* targets, int B, int T, const AdamWHyper& hp,
                       double grad_clip) {
    const double loss = forward_backward(inputs, targets, B, T);
    return apply_update(loss, hp, grad_clip);
  }

  // The logits (vocab_size floats, host) of the position after tokens[0, T)
  // (T <= block_size): what sampling draws the next token from.
  virtual void next_token_logits(const int* tokens, int T, float* out) = 0;

  // Bytes held for activations and their gradients (what scales with
  // max_batch), for memory reports.
  virtual size_t activation_bytes() const = 0;

  // What the backend holds now, by component, in bytes (dilococtl plan's figures are checked
  // against it). Moments and the outer-sync state appear once allocated (the first step,
  // sync_setup); ZeRO-2's gradient buckets once a step has opened them.
  struct Allocated {
    size_t params = 0;         // fp32 parameters (the master copy)
    size_t params_low = 0;     // a low-precision copy (bf16 on a GPU)
    size_t grads = 0;          // gradients: all, or a shard plus its buckets
    size_t moments = 0;        // AdamW m and v
    size_t outer_state = 0;    // per fragment: base, previous base, θ at send, residual, scratch
    size_t outer_state_host = 0;  // the part of it in pinned host memory (train.outer_state: host)
    size_t activations = 0;
  };
  virtual Allocated allocated() const = 0;

  // ---- The learner's outer sync, where the parameters live (DESIGN.md §3) ----
  // Fragment p is a list of parameter ranges; its packed form lays them back to back. For each
  // fragment the backend keeps, in its own memory, base_p (the global fragment last folded), the
  // base before the last Global, θ_p as of the last delta sent, and the error-feedback residual,
  // so on a GPU only encoded payloads cross to the host. The codecs are kernels/sync_ops.h's
  // dense ones, applied range by range (the wire's per-tensor layout, daemon/net/codec.h); the
  // CPU backend is the reference, the CUDA one is byte-identical.
  // Sets up the fragments: base_p = θ_p, residuals zero.
  virtual void sync_setup(const std::vector<std::vector<ParamRange>>& fragments) = 0;
  // base_p = θ_p = packed (a snapshot or a resync); the residual is dropped.
  virtual void sync_install(int p, const float* packed) = 0;
  // Encodes Δ = base_p − θ_p plus the residual, range by range, into payload (the ranges'
  // encodings back to back, range_bytes each); the residual keeps what the codec lost; θ_p is
  // kept as "at send". false, with nothing changed, when a value is not finite.
  virtual bool sync_encode_delta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                                 std::vector<uint64_t>* range_bytes) = 0;
  virtual void sync_reset_residual(int p) = 0;
  // previous base = base_p; base_p += Decode(payload) (the same layout). false on a payload the
  // encoder never writes (nothing changed then).
  virtual bool sync_apply_update(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block) = 0;
  // θ_p ← fold(θ_p, base_p) (kernels/sync_ops.h; included is read by kReplay only).
  virtual void sync_fold(int p, FoldMode mode, double alpha, FoldIncluded included) = 0;
  // θ at send += base_p − previous base: a replay that folded a Global without our delta keeps
  // θ at send in the frame the later fold of our delta subtracts it in.
  virtual void sync_shift_at_send(int p) = 0;
  // base_p (packed, host): for tests.
  virtual void sync_read_base(int p, float* packed) const = 0;

 protected:
  // The values of a fragment's ranges; every range must lie inside the parameters.
  size_t checked_fragment_numel(const std::vector<ParamRange>& ranges) const;

 public:

  // Mean loss of a batch without touching gradients or parameters.
  virtual double eval_loss(const int* inputs, const int* targets, int B, int T) = 0;
};

// Devices this build can create: "cpu", plus "cuda" when built with CUDA.
bool BackendCompiled(const std::string& kind);

// Whether `ranks` ranks starting at device ("cpu", "cuda", "cuda:N") can be
// created here: empty, or what is missing (no CUDA in this build, no GPU
// visible, too few GPUs) and what to do. Cheap: allocates nothing.
std::string CheckDeviceAvailable(const std::string& device, int ranks);

// The device of rank `rank` of a local ring on `device`: "cpu" for every CPU
// rank, "cuda:N+rank" for a ring that starts at "cuda:N" ("cuda" = "cuda:0").
std::string RankDevice(const std::string& device, int rank);

// The collectives of a local ring of `ranks` ranks on `device`: threads on
// "cpu", NCCL over cuda:N..N+ranks-1 on "cuda:N". Returns an empty string on
// success, else what went wrong and what to do.
[[nodiscard]] std::string CreateLocalCommGroup(const std::string& device, int ranks,
                                               std::unique_ptr<LocalCommGroup>* out);

// This process's part of a ring across the hosts of a site: local_ranks
// ranks, global ranks first_rank .. first_rank + local_ranks - 1 of
// world_size, meeting through store. On "cpu" Gloo's TCP transport bound on
// address (kernels/comm/gloo_comm.h); on "cuda:N" NCCL over cuda:N..
// N+local_ranks-1 (kernels/cuda/nccl_comm.h). Blocks until every host's part
// has joined, or timeout_ms, which also bounds every collective.
struct RingAcrossHostsComm {
  std::string ring_name;  // a new ring (incarnation) a new name
  int world_size = 1;
  int first_rank = 0;
  int local_ranks = 1;
  std::string address;  // cpu: where this host's part binds (the site's private network)
  int64_t timeout_ms = 60000;
  std::shared_ptr<CommStore> store;
};
[[nodiscard]] std::string CreateCommGroupAcrossHosts(const std::string& device, const RingAcrossHostsComm& ring,
                                                     std::unique_ptr<LocalCommGroup>* out);

// Creates the backend named by device ("cpu", "cuda", "cuda:N"). Returns an
// empty string on success, else what went wrong and what to do (e.g. no
// CUDA in this build, no device present, device index out of range).
[[nodiscard]] std::string CreateBackend(const std::string& device, const BackendOptions& options,
                                        std::unique_ptr<TrainingBackend>* out);

// One inner step of rank comm.rank() of a local ring: forward_backward on
// this rank's batch, mean all-reduce of the gradients and of the loss, then
// apply_update on every rank with the same gradient, so every rank keeps the
// same parameters (the mean gradient of equal-sized batches is the gradient
// of the mean loss of their union). comm must use the backend's memory.
[[nodiscard]] CommStatus ring_train_step(TrainingBackend& backend, LocalComm& comm, const int* inputs,
                                         const int* targets, int B, int T, const AdamWHyper& hp, double grad_clip,
                                         StepStats* stats);

}  // namespace diloco
