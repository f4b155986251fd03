// The CUDA training backend. Host code only: it enqueues the launchers of
// ops.h and gemm.h on one stream. Mirrors Gpt::forward / Gpt::backward
// (kernels/gpt.cpp) op for op, with two differences: the residual adds are
// fused into the LayerNorms that follow them, and attention keeps the row
// log-sum-exp instead of the (T,T) probabilities.
//
// train.shard (kernels/shard.h) on a GPU ring: gradients reduce-scattered
// (ZeRO-1: the whole buffer after backward; ZeRO-2: bucket by bucket as the
// backward finishes them, grad_buckets.h), AdamW moments kept and updated for
// this rank's shard only, the global norm from the ranks' chunk sums, and the
// updated shard all-gathered. The parameter buffer (and ZeRO-1's gradient
// buffer) is padded to world equal shards (kernels/shard.h), so those two
// collectives are one ncclReduceScatter and one ncclAllGather. They run on
// comm_stream_, ordered against the compute stream with events: the host
// waits for the ring once after the backward and once after the gather, never
// per bucket. The fp32 parameters stay whole on every rank:
// param_buffer(), download_params and the outer-sync state's pieces
// (daemon/train/outer_state.h) read and write fp32 θ anywhere in the table,
// so the gather moves fp32 and each rank refreshes its bf16 copy from it.
//
// train.recompute: the forward keeps each block's output (the next block's
// input) and one block's worth of the other activations; the backward runs
// block l's forward again from its input before its backward. The recomputed
// LayerNorm of a block's input is the unfused call on the stored bf16
// residual, which normalises the same values in the same order as the fused
// residual-add + LayerNorm of the forward, so the gradients are the stored
// path's bits, provided cuBLASLt sees the same pointer alignments in both
// (it picks its algorithm by them): max_batch * T * C a multiple of 128, so
// every per-layer slot starts on 256 bytes as the single recompute slot does.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grad_buckets.h"
#include "kernels/cuda/ops.h"
#include "kernels/grad_clip.h"

namespace diloco::cuda {

static_assert(kNormChunk == kShardAlign, "shards must end on norm chunks (kernels/shard.h)");

namespace {

// Per-block tensors in layout order (gpt.cpp kBlockTensors).
enum BlockTensor { kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb, kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb };
constexpr int kNumBlockTensors = 12;

class CudaBackend final : public TrainingBackend {
 public:
  CudaBackend(int device, const BackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  const GptConfig& config() const override { return config_; }
  const TensorTable& table() const override { return table_; }

  void upload_params(const float* host, size_t offset, size_t count) override;
  void download_params(float* host, size_t offset, size_t count) const override;
  float* param_buffer() override { return params_.get(); }
  size_t param_buffer_floats() const override { return params_.size(); }
  void params_written(size_t offset, size_t count) override;
  void download_optimizer(AdamWState* out) const override;
  void upload_optimizer(const AdamWState& state) override;

  double forward_backward(const int* inputs, const int* targets, int B, int T) override;
  float* grad_buffer() override { return grads_.get(); }  // null with ZeRO-2
  MemorySpace grad_memory() const override { return MemorySpace::kDevice; }
  void download_grads(float* host) const override;
  StepStats apply_update(double loss, const AdamWHyper& hp, double grad_clip) override;
  double eval_loss(const int* inputs, const int* targets, int B, int T) override;
  void next_token_logits(const int* tokens, int T, float* out) override;
  void sync_setup(const std::vector<std::vector<ParamRange>>& fragments) override;
  void sync_install(int p, const float* packed) override;
  bool sync_encode_delta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                         std::vector<uint64_t>* range_bytes) override;
  void sync_reset_residual(int p) override;
  bool sync_apply_update(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block) override;
  void sync_fold(int p, FoldMode mode, double alpha, FoldIncluded included) override;
  void sync_shift_at_send(int p) override;
  void sync_read_base(int p, float* packed) const override;
  ParamRange optimizer_range() const override { return shard_; }
  ShardMode shard() const override { return shard_mode_; }
  CommStatus sharded_train_step(LocalComm& comm, const int* inputs, const int* targets, int B, int T,
                                const AdamWHyper& hp, double grad_clip, StepStats* stats) override;
  Allocated allocated() const override {
    Allocated a;
    a.params = params_.size() * sizeof(float);
    a.params_low = params16_.size() * sizeof(bf16);
    a.grads = grads_.size() * sizeof(float) + (buckets_ ? buckets_->bytes() : 0);
    a.moments = (m_.size() + v_.size()) * sizeof(float);
    size_t fragments = 0;
    for (const SyncFragment& f : sync_)
      fragments += f.base.size() + f.previous_base.size() + f.at_send.size() + f.residual.size();
    const size_t scratch = sync_theta_.size() + sync_values_.size() + sync_residual_.size();
    a.outer_state = (fragments + scratch) * sizeof(float) + sync_payload_.size();
    if (outer_memory_ == Memory::kPinnedHost) a.outer_state_host = fragments * sizeof(float);
    a.activations = activation_bytes();
    return a;
  }
  size_t activation_bytes() const override {
    return act16_.size() * sizeof(bf16) + act32_.size() * sizeof(float) + scratch_.size() * sizeof(float);
  }

 private:
  struct Acts {
    bf16* encoded;
    bf16 *ln1, *qkv, *atty, *attproj, *residual2, *ln2, *fch, *fch_gelu, *fcproj, *residual3;  // per layer
    bf16 *lnf, *logits;
    bf16 *dresidual, *dln, *dqkv, *datty, *dfch, *dfch_gelu;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;  // per layer
    float *lnf_mean, *lnf_rstd, *losses, *loss;
  };

  // A fragment's outer-sync state on the device, or in pinned host memory that the same kernels
  // use in place (train.outer_state; TrainingBackend's sync ops; CpuBackend's twin).
  struct SyncFragment {
    std::vector<ParamRange> ranges;
    size_t numel = 0;
    DeviceArray<float> base, previous_base, at_send, residual;
  };
  SyncFragment& fragment(int p);
  void gather(const SyncFragment& f, float* packed);         // θ_p → packed (device)
  void scatter(const SyncFragment& f, const float* packed);  // packed (device) → θ_p and its bf16 copy
  bool bad_flag();                                           // reads sync_bad_ (waits for the stream)
  void zero(DeviceArray<float>& a);                          // a fragment's array = 0, on the stream's turn

  void upload_batch(const int* inputs, const int* targets, int B, int T);
  void upload_token_buckets(const int* inputs, int N);  // the encoder backward's, for backward()
  void forward(int B, int T, bool backward_follows);
  void block_forward(int l, int B, int T, bool whole);  // whole: through fcproj and the next LayerNorm
  void backward(int B, int T);
  double read_loss();
  // Gradient buckets: no-ops on a whole gradient buffer; ZeRO-2 opens and reduce-scatters them.
  void open_bucket(size_t offset, size_t count) {
    if (buckets_) buckets_->Open(offset, count);
  }
  void close_bucket(size_t offset, size_t count) {
    if (buckets_) buckets_->Close(offset, count);
  }
  size_t block_numel(int l) const {
    return (l + 1 < config_.n_layer ? offset(l + 1, kLn1w) : off_lnfw_) - offset(l, kLn1w);
  }
  // The squared global norm of this rank's shard of the mean gradients, summed over the ring.
  CommStatus sharded_norm(LocalComm& comm, const float* grads, double* norm);

  size_t offset(int l, BlockTensor k) const { return block_offsets_[(size_t)l * kNumBlockTensors + k]; }
  const bf16* w16(size_t off) const { return params16_.get() + off; }
  float* g32(size_t off) { return buckets_ ? buckets_->At(off) : grads_.get() + off; }
  size_t slot(int l) const { return recompute_ ? 0 : (size_t)l; }  // a per-layer activation slot

  int device_;
  std::string name_;
  GptConfig config_;
  int max_batch_;
  bool recompute_;
  Memory outer_memory_;  // where SyncFragment's arrays live (train.outer_state)
  ShardMode shard_mode_;
  std::vector<size_t> shard_counts_;   // ShardCounts of the ring: the real values (sharded only)
  std::vector<size_t> padded_counts_;  // ShardPaddedCounts: the parts of the padded buffers
  ParamRange shard_;                   // the range whose AdamW state this rank keeps: all unsharded
  TensorTable table_;
  size_t off_wte_, off_wpe_, off_lnfw_, off_lnfb_;
  std::vector<size_t> block_offsets_;

  Stream stream_ = nullptr;
  Stream comm_stream_ = nullptr;  // a sharded ring's collectives (sharded_train_step, grad_buckets.h)
  // Order the two streams (sharded_train_step); made after set_device: an event is recorded on
  // streams of the device it was created on.
  std::unique_ptr<StreamEvent> compute_ready_, comm_done_;
  std::unique_ptr<Gemm> gemm_;
  // params_ and (ZeRO-1) grads_: padded to ShardPaddedFloats on a sharded ring, the pads past the
  // table zero; grads_: none with ZeRO-2; m_, v_: shard_ only.
  DeviceArray<float> params_, grads_, m_, v_;
  DeviceArray<bf16> params16_;
  std::unique_ptr<GradBuckets> buckets_;  // ZeRO-2
  long step_ = 0;
  DeviceArray<AdamWChunk> chunks_;  // AdamW's chunks of shard_, offsets from shard_.offset
  DeviceArray<bf16> act16_;
  DeviceArray<float> act32_;
  Acts a_{};
  size_t nc_ = 0, nr_ = 0, lse_stride_ = 0;  // per-layer strides (max batch)
  DeviceArray<int> tokens_, targets_, order_, bucket_start_, bucket_token_;
  int num_buckets_ = 0;
  DeviceArray<float> scratch_;
  DeviceArray<double> norm_scratch_, norm_out_;
  std::vector<SyncFragment> sync_;
  DeviceArray<float> sync_theta_, sync_values_, sync_residual_;  // scratch of the largest fragment
  // Each range's encoding at a 4-byte aligned offset (the codec kernels read fp32 scales); the
  // host payload packs them back to back.
  DeviceArray<uint8_t> sync_payload_;
  DeviceArray<int> sync_bad_;  // allocated in sync_setup, on this backend's device
};

CudaBackend::CudaBackend(int device, const BackendOptions& options)
    : device_(device),
      config_(options.model),
      max_batch_(options.max_batch),
      recompute_(options.recompute),
      outer_memory_(options.outer_state == OuterStatePlace::kHost ? Memory::kPinnedHost : Memory::kDevice),
      shard_mode_(options.shard),
      table_(gpt_tensor_table(options.model)) {
  set_device(device);
  name_ = "cuda:" + std::to_string(device) + " " + device_description(device);
  const GptConfig& g = config_;
  DL_CHECK(g.n_embd % g.n_head == 0, "n_embd %d %% n_head %d", g.n_embd, g.n_head);
  DL_CHECK(g.n_embd / g.n_head <= kMaxAttentionHeadSize, "head size %d > %d: not supported by the CUDA attention",
           g.n_embd / g.n_head, kMaxAttentionHeadSize);
  stream_ = create_stream();
  comm_stream_ = create_stream();
  compute_ready_ = std::make_unique<StreamEvent>();
  comm_done_ = std::make_unique<StreamEvent>();
  gemm_ = std::make_unique<Gemm>();

  const std::vector<TensorInfo>& ts = table_.tensors();
  off_wte_ = table_.find("wte")->offset;
  off_wpe_ = table_.find("wpe")->offset;
  off_lnfw_ = table_.find("ln_f.weight")->offset;
  off_lnfb_ = table_.find("ln_f.bias")->offset;
  for (int l = 0; l < g.n_layer; l++)
    for (int k = 0; k < kNumBlockTensors; k++) block_offsets_.push_back(ts[2 + l * kNumBlockTensors + k].offset);

  const size_t n = table_.total_numel();
  shard_ = {0, n};
  size_t buffer = n;  // floats of params_ (and ZeRO-1's grads_)
  if (shard_mode_ != ShardMode::kNone) {
    shard_counts_ = ShardCounts(n, options.world);
    padded_counts_ = ShardPaddedCounts(n, options.world);
    shard_ = {PartOffset(shard_counts_, options.rank), shard_counts_[options.rank]};
    buffer = ShardPaddedFloats(n, options.world);
  }
  params_ = DeviceArray<float>(buffer);
  params16_ = DeviceArray<bf16>(n);
  m_ = DeviceArray<float>(shard_.count);
  v_ = DeviceArray<float>(shard_.count);
  params_.fill(0);
  params16_.fill(0);
  m_.fill(0);
  v_.fill(0);
  if (shard_mode_ == ShardMode::kGradients) {
    // Buckets: wte + wpe (open throughout the backward), then ln_f and each block in turn.
    size_t other = table_.find("ln_f.weight")->numel + table_.find("ln_f.bias")->numel;
    for (int l = 0; l < g.n_layer; l++) other = std::max(other, block_numel(l));
    const TensorInfo *wte = table_.find("wte"), *wpe = table_.find("wpe");
    DL_CHECK(wte->offset == 0 && wpe->offset == wte->numel, "the embeddings must lead the table");
    buckets_ =
        std::make_unique<GradBuckets>(shard_counts_, shard_, wte->numel + wpe->numel, other, stream_, comm_stream_);
  } else {
    grads_ = DeviceArray<float>(buffer);
    grads_.fill(0);
  }
  // AdamW's chunks: each tensor's part in the shard, from the shard's start.
  std::vector<AdamWChunk> chunks;
  for (const TensorInfo& t : ts) {
    const size_t a = std::max(t.offset, shard_.offset), z = std::min(t.offset + t.numel, shard_.offset + shard_.count);
    if (a < z) append_adamw_chunks(&chunks, a - shard_.offset, z - a, gpt_tensor_decays(t));
  }
  if (!chunks.empty()) chunks_ = DeviceArray<AdamWChunk>(chunks);  // a rank may own nothing

  // Activations, carved like Gpt's, each slot 256-byte aligned. With recompute the per-layer
  // slots hold one layer (LS), except residual3: block l's output is block l+1's input.
  const size_t B = max_batch_, T = g.block_size, C = g.n_embd, L = g.n_layer, NH = g.n_head, V = g.vocab_size;
  const size_t LS = recompute_ ? std::min<size_t>(L, 1) : L;
  const size_t N = B * T;
  nc_ = N * C;
  nr_ = N;
  lse_stride_ = B * NH * T;
  struct Slot16 {
    bf16** p;
    size_t count;
  };
  const Slot16 s16[] = {
      {&a_.encoded, N * C},           {&a_.ln1, LS * N * C},      {&a_.qkv, LS * N * 3 * C},
      {&a_.atty, LS * N * C},         {&a_.attproj, LS * N * C},  {&a_.residual2, LS * N * C},
      {&a_.ln2, LS * N * C},          {&a_.fch, LS * N * 4 * C},  {&a_.fch_gelu, LS * N * 4 * C},
      {&a_.fcproj, LS * N * C},       {&a_.residual3, L * N * C}, {&a_.lnf, N * C},
      {&a_.logits, N * V},           {&a_.dresidual, N * C},    {&a_.dln, N * C},
      {&a_.dqkv, N * 3 * C},         {&a_.datty, N * C},        {&a_.dfch, N * 4 * C},
      {&a_.dfch_gelu, N * 4 * C},
  };
  const auto round = [](size_t count, size_t elem) { return (count * elem + 255) / 256 * 256 / elem; };
  size_t total16 = 0;
  for (const Slot16& s : s16) total16 += round(s.count, 2);
  act16_ = DeviceArray<bf16>(total16);
  bf16* p16 = act16_.get();
  for (const Slot16& s : s16) {
    *s.p = p16;
    p16 += round(s.count, 2);
  }
  struct Slot32 {
    float** p;
    size_t count;
  };
  const Slot32 s32[] = {
      {&a_.ln1_mean, LS * N}, {&a_.ln1_rstd, LS * N}, {&a_.ln2_mean, LS * N}, {&a_.ln2_rstd, LS * N},
      {&a_.lse, LS * B * NH * T}, {&a_.lnf_mean, N}, {&a_.lnf_rstd, N}, {&a_.losses, N}, {&a_.loss, 1},
  };
  size_t total32 = 0;
  for (const Slot32& s : s32) total32 += round(s.count, 4);
  act32_ = DeviceArray<float>(total32);
  float* p32 = act32_.get();
  for (const Slot32& s : s32) {
    *s.p = p32;
    p32 += round(s.count, 4);
  }

  size_t scratch = layernorm_backward_scratch_floats((int)N, (int)C);
  scratch = std::max(scratch, bias_backward_scratch_floats((int)N, (int)(4 * C)));
  scratch = std::max(scratch, attention_backward_scratch_floats((int)B, (int)T, (int)NH));
  scratch_ = DeviceArray<float>(scratch);
  norm_scratch_ = DeviceArray<double>(global_norm_scratch_doubles(n));
  norm_out_ = DeviceArray<double>(1);
  tokens_ = DeviceArray<int>(N);
  targets_ = DeviceArray<int>(N);
  order_ = DeviceArray<int>(N);
  bucket_start_ = DeviceArray<int>(N + 1);
  bucket_token_ = DeviceArray<int>(N);
}

CudaBackend::~CudaBackend() {
  set_device(device_);
  synchronize(stream_);
  synchronize(comm_stream_);
  buckets_.reset();
  gemm_.reset();
  destroy_stream(comm_stream_);
  destroy_stream(stream_);
}

void CudaBackend::upload_params(const float* host, size_t offset, size_t count) {
  set_device(device_);  // the caller's thread may not have selected it
  DL_CHECK(offset + count <= num_params(), "params range [%zu, +%zu) outside %zu", offset, count, num_params());
  copy_to_device(params_.get() + offset, host, count * sizeof(float), stream_);
  float_to_bf16(params16_.get() + offset, params_.get() + offset, count, stream_);
  synchronize(stream_);
}

void CudaBackend::params_written(size_t offset, size_t count) {
  set_device(device_);  // the caller's thread may not have selected it
  DL_CHECK(offset + count <= num_params(), "params range [%zu, +%zu) outside %zu", offset, count, num_params());
  float_to_bf16(params16_.get() + offset, params_.get() + offset, count, stream_);
  synchronize(stream_);
}

void CudaBackend::download_params(float* host, size_t offset, size_t count) const {
  set_device(device_);  // the caller's thread may not have selected it
  DL_CHECK(offset + count <= num_params(), "params range [%zu, +%zu) outside %zu", offset, count, num_params());
  copy_to_host(host, params_.get() + offset, count * sizeof(float), stream_);
}

void CudaBackend::download_grads(float* host) const {
  set_device(device_);  // the caller's thread may not have selected it
  if (shard_mode_ == ShardMode::kNone) {
    copy_to_host(host, grads_.get(), num_params() * sizeof(float), stream_);
    return;
  }
  // Sharded (after a sharded step): the shard's mean gradients, zeros elsewhere (CpuBackend's).
  std::fill_n(host, num_params(), 0.0f);
  const float* shard = buckets_ ? buckets_->grads() : grads_.get() + shard_.offset;
  if (shard_.count) copy_to_host(host + shard_.offset, shard, shard_.count * sizeof(float), stream_);
}

// Sharded, the moments are shard_'s: download writes that range of out->m and out->v (sizing them
// to num_params first), upload takes that range (backend.h).
void CudaBackend::download_optimizer(AdamWState* out) const {
  set_device(device_);  // the caller's thread may not have selected it
  const size_t n = num_params();
  if (out->m.size() != n) out->m.assign(n, 0.0f);
  if (out->v.size() != n) out->v.assign(n, 0.0f);
  if (shard_.count) {
    copy_to_host(out->m.data() + shard_.offset, m_.get(), shard_.count * sizeof(float), stream_);
    copy_to_host(out->v.data() + shard_.offset, v_.get(), shard_.count * sizeof(float), stream_);
  }
  out->step = step_;
}

void CudaBackend::upload_optimizer(const AdamWState& state) {
  const size_t n = num_params(), count = shard_.count;
  DL_CHECK(state.m.empty() || (state.m.size() == n && state.v.size() == n), "AdamW state of %zu values, model %zu",
           state.m.size(), n);
  set_device(device_);
  step_ = state.step;
  if (count == 0) return;  // a rank of a sharded ring that owns nothing
  if (state.m.empty()) {
    fill_bytes(m_.get(), 0, count * sizeof(float), stream_);
    fill_bytes(v_.get(), 0, count * sizeof(float), stream_);
    synchronize(stream_);
  } else {
    copy_to_device(m_.get(), state.m.data() + shard_.offset, count * sizeof(float), stream_);
    copy_to_device(v_.get(), state.v.data() + shard_.offset, count * sizeof(float), stream_);
  }
}

void CudaBackend::upload_batch(const int* inputs, const int* targets, int B, int T) {
  DL_CHECK(B >= 1 && B <= max_batch_, "batch %d outside [1, %d]", B, max_batch_);
  DL_CHECK(T >= 1 && T <= config_.block_size, "sequence %d outside [1, %d]", T, config_.block_size);
  const int N = B * T, V = config_.vocab_size;
  for (int i = 0; i < N; i++) {
    DL_CHECK(inputs[i] >= 0 && inputs[i] < V, "token %d out of vocabulary", inputs[i]);
    if (targets) DL_CHECK(targets[i] >= 0 && targets[i] < V, "target %d out of vocabulary", targets[i]);
  }
  copy_to_device(tokens_.get(), inputs, N * sizeof(int), stream_);
  if (targets) copy_to_device(targets_.get(), targets, N * sizeof(int), stream_);
}

void CudaBackend::forward(int B, int T, bool backward_follows) {
  const GptConfig& g = config_;
  const int C = g.n_embd, V = g.vocab_size, L = g.n_layer, N = B * T;
  Acts& a = a_;
  encoder_forward(a.encoded, tokens_.get(), w16(off_wte_), w16(off_wpe_), B, T, C, stream_);
  if (L > 0) {
    layernorm_forward(nullptr, a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, nullptr, w16(offset(0, kLn1w)),
                      w16(offset(0, kLn1b)), N, C, stream_);
  } else {
    layernorm_forward(nullptr, a.lnf, a.lnf_mean, a.lnf_rstd, a.encoded, nullptr, w16(off_lnfw_), w16(off_lnfb_), N,
                      C, stream_);
  }
  for (int l = 0; l < L; l++) block_forward(l, B, T, /*whole=*/true);
  gemm_->matmul_forward(a.logits, nullptr, a.lnf, w16(off_wte_), nullptr, N, C, V, stream_);
  // With a backward to follow, the gradient of the mean loss replaces the
  // logits in place.
  classifier_forward_backward(backward_follows ? a.logits : nullptr, a.losses, a.logits, targets_.get(),
                              1.0f / N, N, V, stream_);
  mean_reduce(a.loss, a.losses, N, stream_);
}

// Block l from its input residual and its ln1 (already in slot(l), written by the LayerNorm that
// ends the block before). whole: through fcproj and the next LayerNorm, writing block l's output
// (residual3) and the next ln1; otherwise (a recompute in the backward) up to fch_gelu, all the
// block's backward reads.
void CudaBackend::block_forward(int l, int B, int T, bool whole) {
  const GptConfig& g = config_;
  const int C = g.n_embd, NH = g.n_head, L = g.n_layer, N = B * T;
  Acts& a = a_;
  const size_t s = slot(l);
  const bf16* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * nc_;
  bf16* ln1 = a.ln1 + s * nc_;
  bf16* qkv = a.qkv + s * 3 * nc_;
  bf16* atty = a.atty + s * nc_;
  bf16* attproj = a.attproj + s * nc_;
  bf16* residual2 = a.residual2 + s * nc_;
  bf16* ln2 = a.ln2 + s * nc_;
  bf16* fch = a.fch + s * 4 * nc_;
  bf16* fch_gelu = a.fch_gelu + s * 4 * nc_;
  bf16* fcproj = a.fcproj + s * nc_;
  bf16* residual3 = a.residual3 + l * nc_;
  gemm_->matmul_forward(qkv, nullptr, ln1, w16(offset(l, kQkvw)), w16(offset(l, kQkvb)), N, C, 3 * C, stream_);
  attention_forward(atty, a.lse + s * lse_stride_, qkv, B, T, C, NH, stream_);
  gemm_->matmul_forward(attproj, nullptr, atty, w16(offset(l, kAttprojw)), w16(offset(l, kAttprojb)), N, C, C,
                        stream_);
  layernorm_forward(residual2, ln2, a.ln2_mean + s * nr_, a.ln2_rstd + s * nr_, residual, attproj,
                    w16(offset(l, kLn2w)), w16(offset(l, kLn2b)), N, C, stream_);
  gemm_->matmul_forward(fch_gelu, fch, ln2, w16(offset(l, kFcw)), w16(offset(l, kFcb)), N, C, 4 * C, stream_);
  if (!whole) return;
  gemm_->matmul_forward(fcproj, nullptr, fch_gelu, w16(offset(l, kFcprojw)), w16(offset(l, kFcprojb)), N, 4 * C, C,
                        stream_);
  // residual3 = residual2 + fcproj, normalised by the next LayerNorm.
  if (l + 1 < L) {
    const size_t next = slot(l + 1);
    layernorm_forward(residual3, a.ln1 + next * nc_, a.ln1_mean + next * nr_, a.ln1_rstd + next * nr_, residual2,
                      fcproj, w16(offset(l + 1, kLn1w)), w16(offset(l + 1, kLn1b)), N, C, stream_);
  } else {
    layernorm_forward(residual3, a.lnf, a.lnf_mean, a.lnf_rstd, residual2, fcproj, w16(off_lnfw_), w16(off_lnfb_),
                      N, C, stream_);
  }
}

void CudaBackend::backward(int B, int T) {
  const GptConfig& g = config_;
  const int C = g.n_embd, NH = g.n_head, V = g.vocab_size, L = g.n_layer, N = B * T;
  Acts& a = a_;
  float* scratch = scratch_.get();
  if (!buckets_) fill_bytes(grads_.get(), 0, num_params() * sizeof(float), stream_);
  // Buckets in the order the backward finishes them (GradSink's): wte + wpe open throughout,
  // ln_f, block L-1 .. 0.
  const size_t embed = off_wpe_ + (size_t)g.block_size * C;
  const size_t lnf = 2 * (size_t)C;
  open_bucket(0, embed);
  open_bucket(off_lnfw_, lnf);
  const bf16* dlogits = a.logits;
  gemm_->matmul_backward(a.dln, g32(off_wte_), nullptr, scratch, dlogits, a.lnf, w16(off_wte_), N, C, V, stream_);
  const bf16* last = L > 0 ? a.residual3 + (L - 1) * nc_ : a.encoded;
  layernorm_backward(a.dresidual, g32(off_lnfw_), g32(off_lnfb_), scratch, a.dln, last, w16(off_lnfw_), a.lnf_mean,
                     a.lnf_rstd, N, C, /*accumulate=*/false, stream_);
  close_bucket(off_lnfw_, lnf);
  for (int l = L - 1; l >= 0; l--) {
    const bf16* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * nc_;
    const size_t s = slot(l);
    if (recompute_) {
      layernorm_forward(nullptr, a.ln1 + s * nc_, a.ln1_mean + s * nr_, a.ln1_rstd + s * nr_, residual, nullptr,
                        w16(offset(l, kLn1w)), w16(offset(l, kLn1b)), N, C, stream_);
      block_forward(l, B, T, /*whole=*/false);
    }
    open_bucket(offset(l, kLn1w), block_numel(l));
    const auto W = [&](BlockTensor k) { return w16(offset(l, k)); };
    const auto G = [&](BlockTensor k) { return g32(offset(l, k)); };
    gemm_->matmul_backward(a.dfch_gelu, G(kFcprojw), G(kFcprojb), scratch, a.dresidual, a.fch_gelu + s * 4 * nc_,
                           W(kFcprojw), N, 4 * C, C, stream_);
    gelu_backward(a.dfch, a.fch + s * 4 * nc_, a.dfch_gelu, (size_t)N * 4 * C, stream_);
    gemm_->matmul_backward(a.dln, G(kFcw), G(kFcb), scratch, a.dfch, a.ln2 + s * nc_, W(kFcw), N, C, 4 * C, stream_);
    layernorm_backward(a.dresidual, G(kLn2w), G(kLn2b), scratch, a.dln, a.residual2 + s * nc_, W(kLn2w),
                       a.ln2_mean + s * nr_, a.ln2_rstd + s * nr_, N, C, true, stream_);
    gemm_->matmul_backward(a.datty, G(kAttprojw), G(kAttprojb), scratch, a.dresidual, a.atty + s * nc_,
                           W(kAttprojw), N, C, C, stream_);
    attention_backward(a.dqkv, scratch, a.datty, a.qkv + s * 3 * nc_, a.atty + s * nc_, a.lse + s * lse_stride_, B,
                       T, C, NH, stream_);
    gemm_->matmul_backward(a.dln, G(kQkvw), G(kQkvb), scratch, a.dqkv, a.ln1 + s * nc_, W(kQkvw), N, C, 3 * C,
                           stream_);
    layernorm_backward(a.dresidual, G(kLn1w), G(kLn1b), scratch, a.dln, residual, W(kLn1w), a.ln1_mean + s * nr_,
                       a.ln1_rstd + s * nr_, N, C, true, stream_);
    close_bucket(offset(l, kLn1w), block_numel(l));
  }
  encoder_backward(g32(off_wte_), g32(off_wpe_), a.dresidual, order_.get(), bucket_start_.get(), bucket_token_.get(),
                   num_buckets_, B, T, C, stream_);
  close_bucket(0, embed);
}

double CudaBackend::read_loss() {
  float loss = 0.0f;
  copy_to_host(&loss, a_.loss, sizeof loss, stream_);
  return loss;
}

void CudaBackend::upload_token_buckets(const int* inputs, int N) {
  // Built on the host while the GPU runs the forward (a few ms at B*T = 32k tokens).
  const TokenBuckets buckets = build_token_buckets(inputs, N);
  num_buckets_ = buckets.num_buckets();
  copy_to_device(order_.get(), buckets.order.data(), buckets.order.size() * sizeof(int), stream_);
  copy_to_device(bucket_start_.get(), buckets.bucket_start.data(), buckets.bucket_start.size() * sizeof(int),
                 stream_);
  copy_to_device(bucket_token_.get(), buckets.bucket_token.data(), buckets.bucket_token.size() * sizeof(int),
                 stream_);
}

double CudaBackend::forward_backward(const int* inputs, const int* targets, int B, int T) {
  set_device(device_);  // the caller's thread may not have selected it
  DL_CHECK(targets != nullptr, "forward_backward needs targets");
  DL_CHECK(!buckets_, "%s keeps no whole gradient buffer (train.shard: gradients): its ring runs sharded_train_step",
           name_.c_str());
  upload_batch(inputs, targets, B, T);
  forward(B, T, /*backward_follows=*/true);
  upload_token_buckets(inputs, B * T);
  backward(B, T);
  return read_loss();  // waits for the whole step
}

CommStatus CudaBackend::sharded_train_step(LocalComm& comm, const int* inputs, const int* targets, int B, int T,
                                           const AdamWHyper& hp, double grad_clip, StepStats* stats) {
  set_device(device_);  // the caller's thread may not have selected it
  DL_CHECK(shard_mode_ != ShardMode::kNone, "%s is not sharded (train.shard: none)", name_.c_str());
  DL_CHECK(comm.world_size() == (int)shard_counts_.size(), "a backend sharded %zu ways on a ring of %d",
           shard_counts_.size(), comm.world_size());
  DL_CHECK(targets != nullptr, "sharded_train_step needs targets");
  StepStats s;
  // The mean loss first: a rank whose loss is not finite makes every rank skip the step together.
  upload_batch(inputs, targets, B, T);
  forward(B, T, /*backward_follows=*/true);
  upload_token_buckets(inputs, B * T);
  s.loss = read_loss();
  if (CommStatus st = comm.all_reduce_host(&s.loss, 1, ReduceOp::kMean); !st.ok()) return st;
  *stats = s;
  if (!std::isfinite(s.loss)) return CommStatus::Ok();
  // Backward; the gradients reduce-scattered: bucket by bucket inside it (ZeRO-2) or whole after it.
  if (buckets_) buckets_->Start(&comm);
  backward(B, T);
  const float* grads = nullptr;
  if (buckets_) {
    // Each bucket's reduce-scatter was enqueued as the backward closed it; one wait for them all.
    if (CommStatus st = buckets_->Finish(); !st.ok()) return st;
    grads = buckets_->grads();
  } else {
    // The padded buffer in one ncclReduceScatter on the comm stream, after the backward (an
    // event, not a host wait); the norm below waits for it.
    compute_ready_->record(stream_);
    compute_ready_->wait(comm_stream_);
    if (CommStatus st = comm.reduce_scatter_on(comm_stream_, grads_.get(), padded_counts_, ReduceOp::kMean); !st.ok())
      return st;
    comm_done_->record(comm_stream_);
    comm_done_->wait(stream_);
    if (CommStatus st = comm.wait_stream(comm_stream_); !st.ok()) return st;
    grads = grads_.get() + shard_.offset;
  }
  if (CommStatus st = sharded_norm(comm, grads, &s.grad_norm); !st.ok()) return st;
  *stats = s;
  if (!std::isfinite(s.grad_norm)) return CommStatus::Ok();
  // Clip + AdamW on the shard (its bf16 copy too), then every rank's shard to every rank.
  step_ += 1;
  const AdamWArgs args{hp.lr,           hp.beta1,
                       hp.beta2,        hp.eps,
                       hp.weight_decay, (float)(hp.grad_scale * clip_scale(s.grad_norm, grad_clip)),
                       step_};
  adamw_update_chunks(params_.get() + shard_.offset, params16_.get() + shard_.offset, m_.get(), v_.get(), grads,
                      chunks_.get(), (int)chunks_.size(), args, stream_);
  // The updated shards, gathered in one ncclAllGather of the padded buffer on the comm stream
  // once AdamW is done with them; the bf16 refresh waits for the gather on the GPU.
  compute_ready_->record(stream_);
  compute_ready_->wait(comm_stream_);
  if (CommStatus st = comm.all_gather_on(comm_stream_, params_.get(), padded_counts_); !st.ok()) return st;
  comm_done_->record(comm_stream_);
  comm_done_->wait(stream_);
  // The other ranks' parts of the bf16 copy: the same rounding AdamW applies to this rank's.
  if (shard_.offset > 0) float_to_bf16(params16_.get(), params_.get(), shard_.offset, stream_);
  const size_t end = shard_.offset + shard_.count;
  if (end < num_params()) float_to_bf16(params16_.get() + end, params_.get() + end, num_params() - end, stream_);
  // The step returns with the parameters whole: the ring's wait first (a failed peer is an error
  // there, where a plain stream wait would hang), then the compute stream's.
  if (CommStatus st = comm.wait_stream(comm_stream_); !st.ok()) return st;
  synchronize(stream_);
  stats->applied = true;
  return CommStatus::Ok();
}

CommStatus CudaBackend::sharded_norm(LocalComm& comm, const float* grads, double* norm) {
  // Every norm chunk lies in one shard: each rank sums its own, the ring adds zeros to the rest
  // (x + 0 = x in any order), and the partials are summed as global_norm_squared sums them.
  const size_t chunks = global_norm_scratch_doubles(num_params());
  fill_bytes(norm_scratch_.get(), 0, chunks * sizeof(double), stream_);
  global_norm_chunk_sums(norm_scratch_.get() + shard_.offset / kNormChunk, grads, shard_.count, stream_);
  std::vector<double> partial(chunks);
  copy_to_host(partial.data(), norm_scratch_.get(), chunks * sizeof(double), stream_);
  if (CommStatus st = comm.all_reduce_host(partial.data(), (int)chunks, ReduceOp::kSum); !st.ok()) return st;
  copy_to_device(norm_scratch_.get(), partial.data(), chunks * sizeof(double), stream_);
  global_norm_of_chunk_sums(norm_out_.get(), norm_scratch_.get(), (num_params() + kNormChunk - 1) / kNormChunk,
                            stream_);
  double sq = 0.0;
  copy_to_host(&sq, norm_out_.get(), sizeof sq, stream_);
  *norm = std::sqrt(sq);
  return CommStatus::Ok();
}

void CudaBackend::next_token_logits(const int* tokens, int T, float* out) {
  set_device(device_);  // the caller's thread may not have selected it
  const int V = config_.vocab_size;
  const std::vector<int> no_targets(T, 0);  // the loss is computed and ignored; the logits stay
  upload_batch(tokens, no_targets.data(), 1, T);
  forward(1, T, /*backward_follows=*/false);
  DeviceArray<float> row(V);
  bf16_to_float(row.get(), a_.logits + (size_t)(T - 1) * V, V, stream_);
  copy_to_host(out, row.get(), V * sizeof(float), stream_);
}

namespace {

size_t AlignUp4(size_t bytes) { return (bytes + 3) / 4 * 4; }

// The most bytes any codec writes for n values (fp32: 4n; int8 at the smallest block, 2: a scale
// per 2 values plus n codes), aligned: a range's slot in the device payload buffer.
size_t AlignedPayloadBytes(size_t n) {
  return AlignUp4(std::max(n * sizeof(float), (n + 1) / 2 * sizeof(float) + n));
}

}  // namespace

CudaBackend::SyncFragment& CudaBackend::fragment(int p) {
  DL_CHECK(p >= 0 && p < (int)sync_.size(), "fragment %d of %zu (sync_setup first)", p, sync_.size());
  return sync_[p];
}

void CudaBackend::gather(const SyncFragment& f, float* packed) {
  for (const ParamRange& r : f.ranges) {
    copy_device_to_device(packed, params_.get() + r.offset, r.count * sizeof(float), stream_);
    packed += r.count;
  }
}

void CudaBackend::scatter(const SyncFragment& f, const float* packed) {
  for (const ParamRange& r : f.ranges) {
    copy_device_to_device(params_.get() + r.offset, packed, r.count * sizeof(float), stream_);
    float_to_bf16(params16_.get() + r.offset, params_.get() + r.offset, r.count, stream_);
    packed += r.count;
  }
}

void CudaBackend::zero(DeviceArray<float>& a) {
  if (a.where() == Memory::kDevice) {
    fill_bytes(a.get(), 0, a.size() * sizeof(float), stream_);
    return;
  }
  synchronize(stream_);  // earlier kernels may still use it
  std::memset(a.get(), 0, a.size() * sizeof(float));
}

bool CudaBackend::bad_flag() {
  int bad = 0;
  copy_to_host(&bad, sync_bad_.get(), sizeof bad, stream_);
  return bad != 0;
}

void CudaBackend::sync_setup(const std::vector<std::vector<ParamRange>>& fragments) {
  set_device(device_);
  sync_.clear();
  sync_.resize(fragments.size());
  size_t largest = 0, largest_payload = 0;
  for (size_t p = 0; p < fragments.size(); p++) {
    SyncFragment& f = sync_[p];
    f.ranges = fragments[p];
    f.numel = checked_fragment_numel(f.ranges);
    largest = std::max(largest, f.numel);
    size_t payload = 0;
    for (const ParamRange& r : f.ranges) payload += AlignedPayloadBytes(r.count);
    largest_payload = std::max(largest_payload, payload);
    f.base = DeviceArray<float>(f.numel, outer_memory_);
    f.previous_base = DeviceArray<float>(f.numel, outer_memory_);
    f.at_send = DeviceArray<float>(f.numel, outer_memory_);
    f.residual = DeviceArray<float>(f.numel, outer_memory_);
    gather(f, f.base.get());
    copy_device_to_device(f.previous_base.get(), f.base.get(), f.numel * sizeof(float), stream_);
    copy_device_to_device(f.at_send.get(), f.base.get(), f.numel * sizeof(float), stream_);
    zero(f.residual);
  }
  sync_theta_ = DeviceArray<float>(largest);
  sync_values_ = DeviceArray<float>(largest);
  sync_residual_ = DeviceArray<float>(largest);
  sync_payload_ = DeviceArray<uint8_t>(largest_payload);
  sync_bad_ = DeviceArray<int>(1);
  synchronize(stream_);
}

void CudaBackend::sync_install(int p, const float* packed) {
  set_device(device_);
  SyncFragment& f = fragment(p);
  copy_to_device(f.base.get(), packed, f.numel * sizeof(float), stream_);
  scatter(f, f.base.get());
  zero(f.residual);
  synchronize(stream_);
}

bool CudaBackend::sync_encode_delta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                                    std::vector<uint64_t>* range_bytes) {
  set_device(device_);
  SyncFragment& f = fragment(p);
  gather(f, sync_theta_.get());
  outer_delta(sync_values_.get(), f.base.get(), sync_theta_.get(), f.numel, stream_);
  // Encode against a copy of the residual: a range that fails leaves the fragment's as it was.
  copy_device_to_device(sync_residual_.get(), f.residual.get(), f.numel * sizeof(float), stream_);
  range_bytes->clear();
  size_t at = 0, slot = 0, value = 0;  // host offset, aligned device offset, value offset
  for (const ParamRange& r : f.ranges) {
    const size_t b = sync_payload_bytes((int)kind, r.count, block);
    if (b == 0 && r.count > 0) return false;
    DL_CHECK(slot + b <= sync_payload_.size(), "payload of %zu bytes past the sync buffer", slot + b);
    sync_encode(sync_payload_.get() + slot, sync_residual_.get() + value, sync_bad_.get(), sync_values_.get() + value,
                (int)kind, block, r.count, stream_);
    if (bad_flag()) return false;
    range_bytes->push_back(b);
    at += b;
    slot += AlignUp4(b);
    value += r.count;
  }
  payload->resize(at);
  at = slot = 0;
  for (uint64_t b : *range_bytes) {  // the only bytes that cross
    copy_to_host(payload->data() + at, sync_payload_.get() + slot, b, stream_);
    at += b;
    slot += AlignUp4(b);
  }
  copy_device_to_device(f.residual.get(), sync_residual_.get(), f.numel * sizeof(float), stream_);
  copy_device_to_device(f.at_send.get(), sync_theta_.get(), f.numel * sizeof(float), stream_);
  synchronize(stream_);
  return true;
}

void CudaBackend::sync_reset_residual(int p) {
  set_device(device_);
  SyncFragment& f = fragment(p);
  zero(f.residual);
  synchronize(stream_);
}

bool CudaBackend::sync_apply_update(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block) {
  set_device(device_);
  SyncFragment& f = fragment(p);
  size_t at = 0, slot = 0, value = 0;  // host offset, aligned device offset, value offset
  for (const ParamRange& r : f.ranges) {
    const size_t b = sync_payload_bytes((int)kind, r.count, block);
    if (b == 0 && r.count > 0) return false;
    if (at + b > bytes || slot + b > sync_payload_.size()) return false;
    copy_to_device(sync_payload_.get() + slot, payload + at, b, stream_);  // the only bytes that cross
    sync_decode(sync_values_.get() + value, sync_bad_.get(), sync_payload_.get() + slot, (int)kind, block, r.count,
                stream_);
    if (bad_flag()) return false;
    at += b;
    slot += AlignUp4(b);
    value += r.count;
  }
  if (at != bytes) return false;
  copy_device_to_device(f.previous_base.get(), f.base.get(), f.numel * sizeof(float), stream_);
  add_difference(f.base.get(), sync_values_.get(), nullptr, f.numel, stream_);
  synchronize(stream_);
  return true;
}

void CudaBackend::sync_fold(int p, FoldMode mode, double alpha, FoldIncluded included) {
  set_device(device_);
  SyncFragment& f = fragment(p);
  gather(f, sync_theta_.get());
  const float* at = included == FoldIncluded::kAtSend ? f.at_send.get() : f.previous_base.get();
  fold(sync_theta_.get(), f.base.get(), at, (int)mode, alpha, f.numel, stream_);
  scatter(f, sync_theta_.get());
  synchronize(stream_);
}

void CudaBackend::sync_shift_at_send(int p) {
  set_device(device_);
  SyncFragment& f = fragment(p);
  add_difference(f.at_send.get(), f.base.get(), f.previous_base.get(), f.numel, stream_);
  synchronize(stream_);
}

void CudaBackend::sync_read_base(int p, float* packed) const {
  set_device(device_);
  DL_CHECK(p >= 0 && p < (int)sync_.size(), "fragment %d of %zu", p, sync_.size());
  copy_to_host(packed, sync_[p].base.get(), sync_[p].numel * sizeof(float), stream_);
}

double CudaBackend::eval_loss(const int* inputs, const int* targets, int B, int T) {
  set_device(device_);  // the caller's thread may not have selected it
  DL_CHECK(targets != nullptr, "eval_loss needs targets");
  upload_batch(inputs, targets, B, T);
  forward(B, T, /*backward_follows=*/false);
  return read_loss();
}

StepStats CudaBackend::apply_update(double loss, const AdamWHyper& hp, double grad_clip) {
  set_device(device_);  // the caller's thread may not have selected it
  DL_CHECK(shard_mode_ == ShardMode::kNone, "%s keeps the AdamW state of its shard only: its ring runs "
           "sharded_train_step (ring_train_step does)", name_.c_str());
  StepStats s;
  s.loss = loss;
  if (!std::isfinite(loss)) return s;
  const size_t n = num_params();
  global_norm_squared(norm_out_.get(), norm_scratch_.get(), grads_.get(), n, stream_);
  double sq = 0.0;
  copy_to_host(&sq, norm_out_.get(), sizeof sq, stream_);
  s.grad_norm = std::sqrt(sq);
  if (!std::isfinite(s.grad_norm)) return s;
  step_ += 1;
  const AdamWArgs args{hp.lr,           hp.beta1,
                       hp.beta2,        hp.eps,
                       hp.weight_decay, (float)(hp.grad_scale * clip_scale(s.grad_norm, grad_clip)),
                       step_};
  adamw_update_chunks(params_.get(), params16_.get(), m_.get(), v_.get(), grads_.get(), chunks_.get(),
                      (int)chunks_.size(), args, stream_);
  synchronize(stream_);
  s.applied = true;
  return s;
}

}  // namespace

std::string CreateCudaBackend(int device, const BackendOptions& options, std::unique_ptr<TrainingBackend>* out) {
  const int head = options.model.n_embd / options.model.n_head;
  if (head > kMaxAttentionHeadSize) {
    return "the CUDA attention supports head sizes up to " + std::to_string(kMaxAttentionHeadSize) + ", not " +
           std::to_string(head) + " (n_embd / n_head): use more heads or the cpu";
  }
  *out = std::make_unique<CudaBackend>(device, options);
  return "";
}

}  // namespace diloco::cuda
