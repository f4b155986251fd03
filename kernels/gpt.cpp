#include "kernels/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/attention.h"
#include "kernels/check.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "kernels/rng.h"

namespace diloco {

namespace {
// Per-block tensors in layout order; LayerParams has the same order.
const char* const kBlockTensors[] = {
    "ln_1.weight",      "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",      "ln_2.bias",
    "mlp.c_fc.weight",  "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
constexpr int kNumBlockTensors = 12;

std::string block_name(int l, const char* suffix) {
  return "h." + std::to_string(l) + "." + suffix;
}
}  // namespace

TensorTable gpt_tensor_table(const GptConfig& g) {
  const int C = g.n_embd;
  TensorTable t;
  t.add("wte", {g.vocab_size, C});
  t.add("wpe", {g.block_size, C});
  for (int l = 0; l < g.n_layer; l++) {
    const std::vector<int> shapes[kNumBlockTensors] = {
        {C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
    for (int k = 0; k < kNumBlockTensors; k++) t.add(block_name(l, kBlockTensors[k]), shapes[k]);
  }
  t.add("ln_f.weight", {C});
  t.add("ln_f.bias", {C});
  return t;
}

bool gpt_tensor_decays(const TensorInfo& tensor) { return tensor.shape.size() == 2; }

Gpt::Gpt(const GptConfig& config, int max_batch, const GptOptions& options)
    : config_(config), max_batch_(max_batch), options_(options), table_(gpt_tensor_table(config)) {
  DL_CHECK(config.n_embd % config.n_head == 0, "n_embd %d %% n_head %d", config.n_embd, config.n_head);
  DL_CHECK(max_batch > 0 && config.block_size > 0, "empty batch");
  const size_t buffer = std::max(table_.total_numel(), options.buffer_floats);
  params_.assign(buffer, 0.0f);
  if (options.keep_grads) grads_.assign(buffer, 0.0f);

  const size_t B = max_batch, T = config.block_size, C = config.n_embd;
  const size_t L = config.n_layer, NH = config.n_head, V = config.vocab_size;
  const size_t N = B * T;
  // Per-layer slots: one per layer, or with recompute one shared by all blocks. residual3 keeps
  // L slots either way, since block l's output is what block l+1's recompute starts from.
  const size_t LS = options.recompute ? std::min<size_t>(L, 1) : L;
  // Carve every activation out of one buffer.
  struct Slot {
    float** ptr;
    size_t count;
  };
  Activations& a = acts_;
  const Slot slots[] = {
      {&a.encoded, N * C},
      {&a.ln1, LS * N * C}, {&a.ln1_mean, LS * N}, {&a.ln1_rstd, LS * N},
      {&a.qkv, LS * N * 3 * C}, {&a.atty, LS * N * C}, {&a.att, LS * B * NH * T * T},
      {&a.attproj, LS * N * C}, {&a.residual2, LS * N * C},
      {&a.ln2, LS * N * C}, {&a.ln2_mean, LS * N}, {&a.ln2_rstd, LS * N},
      {&a.fch, LS * N * 4 * C}, {&a.fch_gelu, LS * N * 4 * C}, {&a.fcproj, LS * N * C},
      {&a.residual3, L * N * C},
      {&a.lnf, N * C}, {&a.lnf_mean, N}, {&a.lnf_rstd, N},
      {&a.logits, N * V}, {&a.losses, N},
      {&a.dresidual, N * C}, {&a.dln, N * C}, {&a.dqkv, N * 3 * C}, {&a.datty, N * C},
      {&a.dfch, N * 4 * C}, {&a.dfch_gelu, N * 4 * C},
  };
  size_t total = 0;
  for (const Slot& s : slots) total += s.count;
  act_buffer_.assign(total, 0.0f);
  float* p = act_buffer_.data();
  for (const Slot& s : slots) {
    *s.ptr = p;
    p += s.count;
  }
}

float* Gpt::tensor(float* base, const char* name) const {
  const TensorInfo* t = table_.find(name);
  DL_CHECK(t != nullptr, "no tensor %s", name);
  return base + t->offset;
}

Gpt::LayerParams Gpt::layer(float* base, int l) const {
  return layer_in_block(base + block_range(l).offset, l);
}

Gpt::LayerParams Gpt::layer_in_block(float* block, int l) const {
  // Block l's tensors follow wte and wpe in kBlockTensors order, back to back.
  const std::vector<TensorInfo>& ts = table_.tensors();
  const size_t start = block_range(l).offset;
  float* p[kNumBlockTensors];
  for (int k = 0; k < kNumBlockTensors; k++) p[k] = block + (ts[2 + l * kNumBlockTensors + k].offset - start);
  return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
}

Gpt::Range Gpt::embedding_range() const {
  const TensorInfo* wte = table_.find("wte");
  const TensorInfo* wpe = table_.find("wpe");
  return {wte->offset, wpe->offset + wpe->numel - wte->offset};  // wpe right after wte
}

Gpt::Range Gpt::block_range(int l) const {
  const std::vector<TensorInfo>& ts = table_.tensors();
  const TensorInfo& first = ts[2 + l * kNumBlockTensors];
  const TensorInfo& last = ts[2 + l * kNumBlockTensors + kNumBlockTensors - 1];
  return {first.offset, last.offset + last.numel - first.offset};
}

Gpt::Range Gpt::lnf_range() const {
  const TensorInfo* w = table_.find("ln_f.weight");
  const TensorInfo* b = table_.find("ln_f.bias");
  return {w->offset, b->offset + b->numel - w->offset};
}

void gpt_init_params(const GptConfig& config, uint64_t seed, float* params) {
  Rng rng(seed);
  const float proj_std = 0.02f / std::sqrt(2.0f * config.n_layer);
  const TensorTable table = gpt_tensor_table(config);
  for (const TensorInfo& t : table.tensors()) {
    float* p = params + t.offset;
    const bool is_ln_weight = t.name.find("ln_") != std::string::npos &&
                              t.name.ends_with(".weight");
    if (is_ln_weight) {
      for (size_t i = 0; i < t.numel; i++) p[i] = 1.0f;
    } else if (t.shape.size() == 1) {
      for (size_t i = 0; i < t.numel; i++) p[i] = 0.0f;
    } else {
      const float std = t.name.ends_with("c_proj.weight") ? proj_std : 0.02f;
      for (size_t i = 0; i < t.numel; i++) p[i] = (float)(rng.normal() * std);
    }
  }
}

void Gpt::init_weights(uint64_t seed) { gpt_init_params(config_, seed, params_.data()); }

void Gpt::block_forward(int l, int slot, const float* residual, int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head;
  const int N = B * T;
  // Activation strides are fixed by max_batch and block_size; a smaller
  // batch uses the front of each slot.
  const size_t NC = (size_t)max_batch_ * config_.block_size * C;
  const size_t NR = (size_t)max_batch_ * config_.block_size;
  const size_t ATT = (size_t)max_batch_ * NH * config_.block_size * config_.block_size;
  const LayerParams w = layer(params(), l);
  Activations& a = acts_;
  float* ln1 = a.ln1 + slot * NC;
  float* qkv = a.qkv + slot * 3 * NC;
  float* atty = a.atty + slot * NC;
  float* attproj = a.attproj + slot * NC;
  float* residual2 = a.residual2 + slot * NC;
  float* ln2 = a.ln2 + slot * NC;
  float* fch = a.fch + slot * 4 * NC;
  float* fch_gelu = a.fch_gelu + slot * 4 * NC;
  float* fcproj = a.fcproj + slot * NC;
  float* residual3 = a.residual3 + l * NC;
  layernorm_forward(ln1, a.ln1_mean + slot * NR, a.ln1_rstd + slot * NR, residual, w.ln1w, w.ln1b, N, C);
  matmul_forward(qkv, ln1, w.qkvw, w.qkvb, N, C, 3 * C);
  attention_forward(atty, a.att + slot * ATT, qkv, B, T, C, NH);
  matmul_forward(attproj, atty, w.attprojw, w.attprojb, N, C, C);
  residual_forward(residual2, residual, attproj, (size_t)N * C);
  layernorm_forward(ln2, a.ln2_mean + slot * NR, a.ln2_rstd + slot * NR, residual2, w.ln2w, w.ln2b, N, C);
  matmul_forward(fch, ln2, w.fcw, w.fcb, N, C, 4 * C);
  gelu_forward(fch_gelu, fch, (size_t)N * 4 * C);
  matmul_forward(fcproj, fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);
  residual_forward(residual3, residual2, fcproj, (size_t)N * C);
}

double Gpt::forward(const int* inputs, const int* targets, int B, int T) {
  DL_CHECK(B >= 1 && B <= max_batch_, "batch %d outside [1, %d]", B, max_batch_);
  DL_CHECK(T >= 1 && T <= config_.block_size, "sequence %d outside [1, %d]", T, config_.block_size);
  const int C = config_.n_embd, V = config_.vocab_size;
  const int L = config_.n_layer;
  const int N = B * T;
  for (int i = 0; i < N; i++) {
    DL_CHECK(inputs[i] >= 0 && inputs[i] < V, "token %d out of vocabulary", inputs[i]);
    if (targets) DL_CHECK(targets[i] >= 0 && targets[i] < V, "target %d out of vocabulary", targets[i]);
  }
  const size_t NC = (size_t)max_batch_ * config_.block_size * C;
  Activations& a = acts_;

  encoder_forward(a.encoded, inputs, tensor(params(), "wte"), tensor(params(), "wpe"), B, T, C);
  // Without recompute each block keeps its own slot; with it they all share slot 0 and only
  // the outputs (residual3) survive the loop.
  for (int l = 0; l < L; l++) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
    block_forward(l, options_.recompute ? 0 : l, residual, B, T);
  }
  const float* residual = L > 0 ? a.residual3 + (L - 1) * NC : a.encoded;
  layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, residual, tensor(params(), "ln_f.weight"),
                    tensor(params(), "ln_f.bias"), N, C);
  matmul_forward(a.logits, a.lnf, tensor(params(), "wte"), nullptr, N, C, V);

  B_ = B;
  T_ = T;
  have_loss_ = targets != nullptr;
  if (!targets) return 0.0f;
  inputs_.assign(inputs, inputs + N);
  targets_.assign(targets, targets + N);
  softmax_crossentropy_forward(a.losses, a.logits, a.logits, targets, N, V);
  double sum = 0.0;
  for (int i = 0; i < N; i++) sum += a.losses[i];
  return sum / N;
}

void Gpt::zero_grad() {
  if (!grads_.empty()) std::memset(grads_.data(), 0, grads_.size() * sizeof(float));
}

void Gpt::backward(GradSink* sink) {
  DL_CHECK(sink != nullptr || !grads_.empty(),
           "Gpt::backward() without a GradSink needs grads(): construct the Gpt with "
           "GptOptions::keep_grads = true, or pass a sink");
  DL_CHECK(have_loss_, "backward() needs a forward() with targets first");
  have_loss_ = false;  // the logits buffer becomes their gradient below
  const int B = B_, T = T_, N = B * T;
  const int C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
  const int L = config_.n_layer;
  const size_t NC = (size_t)max_batch_ * config_.block_size * C;
  const size_t NR = (size_t)max_batch_ * config_.block_size;
  const size_t ATT = (size_t)max_batch_ * NH * config_.block_size * config_.block_size;
  Activations& a = acts_;

  // Gradient buckets: a range's gradients go to the sink's buffer for it, or without a sink to
  // the same range of grads(). Either way the kernels add into zeroed memory.
  auto open = [&](Range r) {
    if (!sink) return grads_.data() + r.offset;
    float* buf = sink->Open(r.offset, r.count);
    DL_CHECK(buf != nullptr, "GradSink::Open(%zu, %zu) gave no buffer", r.offset, r.count);
    return buf;
  };
  auto close = [&](Range r) {
    if (sink) sink->Close(r.offset, r.count);
  };

  // wte + wpe: the LM head adds to wte's gradient now, the encoder at the very end.
  const Range emb = embedding_range();
  float* gemb = open(emb);
  float* gwte = gemb + (table_.find("wte")->offset - emb.offset);
  float* gwpe = gemb + (table_.find("wpe")->offset - emb.offset);

  float* dlogits = a.logits;  // in place over the probabilities
  softmax_crossentropy_backward(dlogits, a.logits, targets_.data(), 1.0f / N, N, V);
  matmul_backward(a.dln, gwte, nullptr, dlogits, a.lnf, tensor(params(), "wte"), N, C, V);
  // dresidual carries the gradient of the residual stream down the blocks.
  std::memset(a.dresidual, 0, (size_t)N * C * sizeof(float));
  const float* last = L > 0 ? a.residual3 + (L - 1) * NC : a.encoded;
  const Range lnf = lnf_range();
  float* glnf = open(lnf);  // ln_f.weight then ln_f.bias
  layernorm_backward(a.dresidual, glnf, glnf + C, a.dln, last, tensor(params(), "ln_f.weight"), a.lnf_mean,
                     a.lnf_rstd, N, C);
  close(lnf);

  for (int l = L - 1; l >= 0; l--) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
    // With recompute, run the block's forward again into the shared slot 0 from its saved
    // input: the same kernels on the same inputs, so the same bits as the stored activations
    // (it also rewrites the block's residual3 with the bits it already holds). Block L-1 ran
    // last in forward(), so slot 0 still holds its activations.
    int s = l;  // the activation slot block l's backward reads
    if (options_.recompute) {
      s = 0;
      if (l != L - 1) block_forward(l, s, residual, B, T);
    }
    const LayerParams w = layer(params(), l);
    const Range block = block_range(l);
    const LayerParams g = layer_in_block(open(block), l);
    // residual3 = residual2 + fcproj: both get dresidual as it is.
    matmul_backward(a.dfch_gelu, g.fcprojw, g.fcprojb, a.dresidual, a.fch_gelu + s * 4 * NC, w.fcprojw, N, 4 * C, C);
    gelu_backward(a.dfch, a.fch + s * 4 * NC, a.dfch_gelu, (size_t)N * 4 * C);
    matmul_backward(a.dln, g.fcw, g.fcb, a.dfch, a.ln2 + s * NC, w.fcw, N, C, 4 * C);
    layernorm_backward(a.dresidual, g.ln2w, g.ln2b, a.dln, a.residual2 + s * NC, w.ln2w, a.ln2_mean + s * NR,
                       a.ln2_rstd + s * NR, N, C);
    // residual2 = residual + attproj: both get dresidual as it is.
    matmul_backward(a.datty, g.attprojw, g.attprojb, a.dresidual, a.atty + s * NC, w.attprojw, N, C, C);
    attention_backward(a.dqkv, a.datty, a.qkv + s * 3 * NC, a.att + s * ATT, B, T, C, NH);
    matmul_backward(a.dln, g.qkvw, g.qkvb, a.dqkv, a.ln1 + s * NC, w.qkvw, N, C, 3 * C);
    layernorm_backward(a.dresidual, g.ln1w, g.ln1b, a.dln, residual, w.ln1w, a.ln1_mean + s * NR,
                       a.ln1_rstd + s * NR, N, C);
    close(block);
  }
  encoder_backward(gwte, gwpe, a.dresidual, inputs_.data(), B, T, C);
  close(emb);
}

}  // namespace diloco
