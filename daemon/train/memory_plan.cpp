#include "daemon/train/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "daemon/net/codec.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/protocol.h"
#include "daemon/train/trainer.h"
#include "kernels/gpt.h"
#include "kernels/shard.h"

namespace diloco {

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kCublasWorkspaceBytes = 32 * kMiB;  // kernels/cuda/gemm.cu kWorkspaceBytes
constexpr uint64_t kAdamWChunkElems = uint64_t{1} << 16;  // kernels/cuda/ops.h
constexpr uint64_t kAdamWChunkBytes = 16;                 // sizeof(AdamWChunk)
constexpr uint64_t kNormChunk = uint64_t{1} << 14;        // kernels/cuda/ops.h
constexpr uint64_t kBf16 = 2, kF32 = 4, kI32 = 4, kF64 = 8;

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// What does not depend on the batch: the table, the shards, the fragments and their payloads.
struct PlanShape {
  const RunConfig* cfg = nullptr;
  bool cuda = false;
  int world = 1;
  uint64_t n = 0;           // parameters
  uint64_t shard = 0;       // rank 0's shard, the largest (ShardCounts)
  uint64_t padded = 0;      // a sharded ring's padded parameter buffer (ShardPaddedFloats)
  uint64_t bucket = 0;      // the gradient buckets open at once on the cpu (ZeRO-2)
  uint64_t cuda_bucket = 0;  // and on cuda (the blocks' bucket double-buffered)
  uint64_t tensor_chunks = 0;  // AdamW chunks on cuda
  bool outer_sync = false;
  uint64_t largest_fragment = 0;   // values
  uint64_t up_payload = 0;         // bytes of the largest fragment's uplink encoding (backend -> host)
  uint64_t down_payload = 0;       // of its downlink encoding
  uint64_t device_payload = 0;     // cuda: the aligned device payload buffer (sync_setup)
  uint64_t topk_payload = 0;       // host top-k encoding of the largest fragment (0: dense)
};

// CudaBackend's AlignedPayloadBytes: the most any codec writes for n values, 4-byte aligned.
uint64_t AlignedPayloadBytes(uint64_t n) {
  const uint64_t b = std::max(n * kF32, (n + 1) / 2 * kF32 + n);
  return (b + 3) / 4 * 4;
}

Status MakeShape(const RunConfig& cfg, PlanShape* s) {
  DeviceSpec device;
  if (Status st = ParseDevice(cfg.train.device, &device); !st.ok()) return st;
  s->cfg = &cfg;
  s->cuda = device.cuda;
  s->world = cfg.train.hosts * cfg.train.ranks;
  const TensorTable table = gpt_tensor_table(GptConfigOf(cfg.model));
  s->n = table.total_numel();
  for (size_t c : ShardCounts(s->n, s->world)) s->shard = std::max<uint64_t>(s->shard, c);
  s->padded = ShardPaddedFloats(s->n, s->world);
  // Buckets: one block's tensors (contiguous), wte + wpe, ln_f.
  uint64_t embed = 0, lnf = 0;
  std::vector<uint64_t> blocks(cfg.model.n_layer, 0);
  for (const TensorInfo& t : table.tensors()) {
    s->tensor_chunks += CeilDiv(t.numel, kAdamWChunkElems);
    if (t.name == "wte" || t.name == "wpe") {
      embed += t.numel;
    } else if (t.name.starts_with("ln_f.")) {
      lnf += t.numel;
    } else {
      const int l = std::stoi(t.name.substr(2));  // "h.<l>.…"
      blocks[l] += t.numel;
    }
  }
  // ZeRO-2's buckets open at once (CpuBackend's ShardedGrads): the embeddings' throughout the
  // backward, and one more for ln_f and then each block in turn.
  uint64_t largest = lnf;
  for (uint64_t b : blocks) largest = std::max(largest, b);
  s->bucket = embed + largest;
  s->cuda_bucket = embed + 2 * largest;

  const SyncConfig& sc = cfg.sync;
  s->outer_sync = sc.mode != SyncMode::kDdp && sc.learners > 1;
  if (!s->outer_sync) return Status::Ok();
  std::vector<Fragment> frags;
  if (Status st = PartitionFragments(table, EffectiveFragments(sc), &frags); !st.ok())
    return st.WithContext("sync.fragments " + std::to_string(sc.fragments));
  const CodecOptions up = UplinkCodec(sc), down = DownlinkCodec(sc);
  for (const Fragment& f : frags) {
    s->largest_fragment = std::max<uint64_t>(s->largest_fragment, f.numel);
    uint64_t up_bytes = 0, down_bytes = 0, device_bytes = 0;
    for (const FragmentRange& r : f.ranges) {
      // With up top-k the backend hands Δ over in fp32; the host encodes it.
      up_bytes += IsSparseCodec(up) ? r.numel * kF32 : EncodedBytes(sc.codec.up, r.numel, sc.codec.block);
      down_bytes += IsSparseCodec(down) ? 0 : EncodedBytes(sc.codec.down, r.numel, sc.codec.block);
      device_bytes += AlignedPayloadBytes(r.numel);
    }
    if (IsSparseCodec(down)) down_bytes = MaxEncodedBytes(down, f.numel);
    s->up_payload = std::max(s->up_payload, up_bytes);
    s->down_payload = std::max(s->down_payload, down_bytes);
    s->device_payload = std::max(s->device_payload, device_bytes);
    if (IsSparseCodec(up)) s->topk_payload = std::max<uint64_t>(s->topk_payload, MaxEncodedBytes(up, f.numel));
  }
  return Status::Ok();
}

std::string PerParam(uint64_t bytes_per_param, const char* what) {
  return std::to_string(bytes_per_param) + " B x " + what;
}

// The cuda activation buffers of CudaBackend's constructor (bf16 slots and fp32 slots, each
// rounded up to 256 bytes, plus the backward scratch), for max batch B.
uint64_t CudaActivationBytes(const ModelConfig& m, uint64_t B, bool recompute) {
  const uint64_t T = m.block_size, C = m.n_embd, NH = m.n_head, V = m.vocab_size;
  const uint64_t L = recompute ? 1 : m.n_layer;  // per-layer slots kept
  const uint64_t N = B * T, NC = N * C;
  const auto round = [](uint64_t count, uint64_t elem) { return CeilDiv(count * elem, 256) * 256; };
  uint64_t bytes = 0;
  for (uint64_t count : {NC, L * NC, L * 3 * NC, L * NC, L * NC, L * NC, L * NC, L * 4 * NC, L * 4 * NC, L * NC,
                         L * NC, NC, N * V, NC, NC, 3 * NC, NC, 4 * NC, 4 * NC})
    bytes += round(count, kBf16);
  if (recompute) bytes += round(uint64_t(m.n_layer) * NC, kBf16);  // each layer's input residual stream
  for (uint64_t count : {L * N, L * N, L * N, L * N, L * B * NH * T, N, N, N, uint64_t{1}})
    bytes += round(count, kF32);
  const uint64_t scratch =
      std::max({CeilDiv(N, 256) * 2 * C, CeilDiv(N, 64) * 4 * C, B * NH * T});  // layernorm, bias, attention
  return bytes + scratch * kF32;
}

// Rank 0's components (rank0) or any other rank's, at max batch B.
void Components(const PlanShape& s, uint64_t B, bool rank0, MemoryPlan* plan) {
  const RunConfig& cfg = *s.cfg;
  const ModelConfig& m = cfg.model;
  const TrainConfig& tc = cfg.train;
  const bool sharded = tc.shard != ShardMode::kNone;
  const bool zero2 = tc.shard == ShardMode::kGradients;
  const uint64_t n = s.n, shard = s.shard, T = m.block_size;
  std::vector<PlanComponent>& c = plan->components;
  std::vector<PlanComponent>& host = plan->host;
  c.clear();
  host.clear();
  const std::string shard_of = "the rank's shard (" + std::to_string(shard) + " of " + std::to_string(n) + ")";
  const uint64_t bucket = s.cuda ? s.cuda_bucket : s.bucket;
  const std::string grads_of =
      "its shard + the buckets open at once (" + std::to_string(shard) + " + " + std::to_string(bucket) + ")";
  // A sharded ring's parameters (and ZeRO-1's gradients) sit in a buffer of world equal shards.
  const uint64_t buffer = sharded ? s.padded : n;
  const std::string padded_of = "the padded buffer (" + std::to_string(s.world) + " equal shards: " +
                                std::to_string(s.padded) + " for " + std::to_string(n) + " params)";
  const uint64_t grad_values = zero2 ? shard + bucket : buffer;
  const bool sync_here = s.outer_sync && (s.cuda ? true : rank0);
  const uint64_t frag = s.largest_fragment;

  if (!s.cuda) {
    c.push_back({"params", "parameters (fp32)", kF32 * buffer,
                 PerParam(4, sharded ? padded_of.c_str() : "params (Gpt::params)"), false});
    c.push_back({"bf16_copy", "bf16 copy", 0, "none on the cpu", false});
    c.push_back({"grads", "gradients (fp32)", kF32 * grad_values,
                 zero2     ? PerParam(4, grads_of.c_str())
                 : sharded ? PerParam(4, padded_of.c_str())
                           : PerParam(4, "params (Gpt::grads)"),
                 false});
    c.push_back({"moments", "AdamW moments", 8 * (sharded ? shard : n),
                 sharded ? PerParam(8, shard_of.c_str()) : PerParam(8, "params (m, v)"), false});
    if (s.outer_sync && sharded) {
      // outer_state.h: every rank keeps its pieces (~1/world of each range); rank 0 also the host
      // mirror of the bases.
      const uint64_t part = CeilDiv(n, s.world), frag_part = CeilDiv(frag, s.world);
      c.push_back({"outer_sync", "outer-sync state",
                   16 * part + 3 * kF32 * frag_part + (rank0 ? kF32 * n : 0) + kF32 * frag,
                   "base, previous base, θ at send, residual (16 B) x the rank's pieces (~" + std::to_string(part) +
                       ") + their scratch + one packed fragment" + (rank0 ? " + the host mirror of the bases (4 B x params)" : ""),
                   false});
    } else if (sync_here) {
      c.push_back({"outer_sync", "outer-sync state", 20 * n + 3 * kF32 * frag,
                   "base, previous base, θ at send, residual (16 B) + the learner's host mirror of the bases "
                   "(4 B) x params + 3 x 4 B x the largest fragment (" + std::to_string(frag) + ") of scratch",
                   false});
    } else {
      c.push_back({"outer_sync", "outer-sync state", 0,
                   s.outer_sync ? "rank 0 only" : "no outer sync (sync.learners 1 or sync.mode ddp)", false});
    }
    c.push_back({"activations", "activations", CpuActivationBytes(m, (int)B, tc.recompute),
                 "Gpt's activation buffer at batch " + std::to_string(B) + (tc.recompute ? " (recompute)" : ""),
                 false});
    uint64_t workspace = 2 * B * T * kI32;  // the inner loop's inputs and targets
    std::string what = "batch buffers (inputs, targets)";
    if (rank0) {
      workspace += 2 * B * T * kI32 + 12 * n;  // evaluation batch; a checkpoint save's host copy
      what += ", the evaluation batch, and a checkpoint save's copy of params + moments (12 B x params)";
    }
    c.push_back({"workspace", "workspace", workspace, what, false});
    if (sync_here) {
      uint64_t codec = s.up_payload + s.down_payload + kF32 * frag;
      std::string detail = "one fragment's uplink and downlink payloads + a decoded fragment (fp32)";
      if (s.topk_payload > 0) {
        codec += kF32 * n + 3 * kF32 * frag + s.topk_payload;
        detail += "; top-k: error feedback (4 B x params), 3 fragment buffers, the top-k payload";
      }
      c.push_back({"codec", "codec buffers", codec, detail, false});
    } else {
      c.push_back({"codec", "codec buffers", 0, "no outer sync on this rank", false});
    }
  } else {
    // The CUDA backend keeps the whole fp32 θ on every rank, sharded or not: checkpoints, the
    // parameter CRC and the outer state's folds read it (the shard's moments are what shrink).
    c.push_back({"params", "master parameters (fp32)", kF32 * buffer,
                 sharded ? PerParam(4, padded_of.c_str()) + " (whole on every rank: all-gathered in fp32)"
                         : PerParam(4, "params"),
                 false});
    c.push_back({"bf16_copy", "bf16 copy", kBf16 * n, PerParam(2, "params"), false});
    c.push_back({"grads", "gradients (fp32)", kF32 * grad_values,
                 zero2     ? PerParam(4, grads_of.c_str())
                 : sharded ? PerParam(4, padded_of.c_str())
                           : PerParam(4, "params"),
                 zero2});
    c.push_back({"moments", "AdamW moments", 8 * (sharded ? shard : n),
                 sharded ? PerParam(8, shard_of.c_str()) : PerParam(8, "params (m, v)"), sharded});
    if (s.outer_sync) {
      const uint64_t part = sharded ? shard : n;
      const uint64_t frag_part = sharded ? CeilDiv(frag, s.world) : frag;
      const std::string state = PerParam(16, sharded ? shard_of.c_str() : "params") +
                                " (base, previous base, θ at send, residual)";
      const std::string scratch = "3 x 4 B x the largest fragment" + std::string(sharded ? "'s part" : "") + " of scratch";
      if (tc.outer_state == OuterStatePlace::kHost) {
        c.push_back({"outer_sync", "outer-sync scratch", 3 * kF32 * frag_part, scratch + " (the state is in host memory)",
                     true});
        host.push_back({"outer_sync", "outer-sync state (pinned)", 16 * part, state + ", every rank", true});
      } else {
        c.push_back({"outer_sync", "outer-sync state", 16 * part + 3 * kF32 * frag_part, state + " + " + scratch,
                     sharded});
      }
    } else {
      c.push_back({"outer_sync", "outer-sync state", 0, "no outer sync (sync.learners 1 or sync.mode ddp)", false});
    }
    c.push_back({"activations", "activations (bf16)", CudaActivationBytes(m, B, tc.recompute),
                 "bf16 slots + fp32 LayerNorm/lse slots + backward scratch at batch " + std::to_string(B) +
                     (tc.recompute ? " (recompute)" : ""),
                 tc.recompute});
    const uint64_t N = B * T;
    c.push_back({"workspace", "workspace",
                 kCublasWorkspaceBytes + (CeilDiv(n, kNormChunk) + 1) * kF64 + (5 * N + 1) * kI32 +
                     s.tensor_chunks * kAdamWChunkBytes,
                 "cuBLASLt workspace (32 MiB), norm partials, token and bucket indices, AdamW chunks", false});
    if (s.outer_sync) {
      const uint64_t payload = sharded ? CeilDiv(s.device_payload, s.world) : s.device_payload;
      c.push_back({"codec", "codec buffers", payload + kI32,
                   "the device payload buffer of the largest fragment" + std::string(sharded ? " (its part)" : ""),
                   sharded});
    } else {
      c.push_back({"codec", "codec buffers", 0, "no outer sync", false});
    }
    // The host side (rank 0's, and every rank's pinned outer state): not on the GPU.
    if (rank0) {
      host.push_back({"checkpoint", "checkpoint save", 12 * n, "host copy of params + moments (12 B x params)", false});
      host.push_back({"batches", "batch buffers", 4 * B * T * kI32, "inputs, targets, evaluation batch", false});
      if (s.outer_sync) {
        host.push_back({"bases_mirror", "host mirror of the bases", kF32 * n, "4 B x params (CRC checks)", false});
        uint64_t codec = s.up_payload + s.down_payload + kF32 * frag;
        if (s.topk_payload > 0) codec += kF32 * n + 3 * kF32 * frag + s.topk_payload;
        host.push_back({"codec", "codec buffers", codec, "payloads, decoded fragment (and top-k buffers)", false});
      }
    }
  }
  plan->total_bytes = 0;
  for (const PlanComponent& x : c) plan->total_bytes += x.bytes;
  plan->host_total_bytes = 0;
  for (const PlanComponent& x : host) plan->host_total_bytes += x.bytes;
}

// The bytes that must fit: per GPU on cuda; on cpu the host process's ranks together (rank 0 +
// train.ranks - 1 others), since a host's CPU ranks share its memory.
uint64_t FitBytes(const PlanShape& s, uint64_t B) {
  MemoryPlan p;
  Components(s, B, true, &p);
  if (s.cuda || s.cfg->train.ranks == 1) return p.total_bytes;
  const uint64_t rank0 = p.total_bytes;
  Components(s, B, false, &p);
  return rank0 + (uint64_t)(s.cfg->train.ranks - 1) * p.total_bytes;
}

}  // namespace

const PlanComponent* MemoryPlan::find(const std::string& key) const {
  for (const PlanComponent& c : components)
    if (c.key == key) return &c;
  return nullptr;
}

const PlanComponent& MemoryPlan::largest() const {
  return *std::max_element(components.begin(), components.end(),
                           [](const PlanComponent& a, const PlanComponent& b) { return a.bytes < b.bytes; });
}

uint64_t CpuActivationBytes(const ModelConfig& m, int max_batch, bool recompute) {
  const uint64_t B = max_batch, T = m.block_size, C = m.n_embd, NH = m.n_head, V = m.vocab_size;
  const uint64_t L = m.n_layer, N = B * T, NC = N * C;
  // Gpt::Gpt's slots. Per layer: ln1, qkv, atty, attproj, residual2, ln2, fch, fch_gelu, fcproj,
  // residual3 (18 NC), four LayerNorm mean/rstd rows (4 N) and the attention matrix.
  const uint64_t per_layer = 18 * NC + 4 * N + B * NH * T * T;
  // Once: encoded, lnf (+ mean, rstd), logits, losses, and the backward's gradient scratch
  // dresidual, dln, dqkv, datty, dfch, dfch_gelu (14 NC).
  const uint64_t once = 2 * NC + 2 * N + N * V + N + 14 * NC;
  const uint64_t floats = once + (recompute ? per_layer + L * NC : L * per_layer);
  return floats * kF32;
}

Status PlanLearnerMemory(const RunConfig& cfg, MemoryPlan* out) {
  PlanShape s;
  DL_RETURN_IF_ERROR(MakeShape(cfg, &s));
  MemoryPlan plan;
  plan.cuda = s.cuda;
  plan.world = s.world;
  plan.num_params = s.n;
  plan.outer_sync = s.outer_sync;
  Components(s, cfg.train.batch_size, true, &plan);
  plan.fit_bytes = FitBytes(s, cfg.train.batch_size);
  if (!s.cuda) {
    plan.notes.push_back(
        "not modelled: the process's fixed overhead (binary, libraries, corpus, allocator, thread stacks), "
        "typically tens of MiB");
    if (cfg.train.ranks > 1)
      plan.notes.push_back("the " + std::to_string(cfg.train.ranks) +
                           " CPU ranks of a host share its memory: the fit is checked for rank 0 + " +
                           std::to_string(cfg.train.ranks - 1) + " other ranks");
  } else {
    plan.notes.push_back("not modelled: the CUDA context, NCCL buffers and allocator rounding (about 0.5-1 GiB per GPU)");
    if (cfg.train.shard != ShardMode::kNone || cfg.train.recompute || cfg.train.outer_state == OuterStatePlace::kHost)
      plan.notes.push_back(
          "rows marked modelled: not yet run on a GPU (sharding / recompute / host outer state on cuda follow the "
          "design)");
    if (cfg.train.outer_state == OuterStatePlace::kHost && plan.outer_sync)
      plan.notes.push_back("train.outer_state host: each GPU's outer-sync state is pinned host memory, so a host of " +
                           std::to_string(cfg.train.ranks) + " ranks pins " + std::to_string(cfg.train.ranks) +
                           " x the host row of that name");
  }
  *out = std::move(plan);
  return Status::Ok();
}

int LargestBatchThatFits(const RunConfig& cfg, uint64_t device_bytes) {
  PlanShape s;
  if (!MakeShape(cfg, &s).ok()) return 0;
  if (FitBytes(s, 1) > device_bytes) return 0;
  uint64_t lo = 1, hi = 2;  // FitBytes(lo) fits; find an hi that does not
  while (hi <= (uint64_t{1} << 24) && FitBytes(s, hi) <= device_bytes) {
    lo = hi;
    hi *= 2;
  }
  if (hi > (uint64_t{1} << 24)) return (int)lo;
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (FitBytes(s, mid) <= device_bytes ? lo : hi) = mid;
  }
  return (int)lo;
}

}  // namespace diloco
