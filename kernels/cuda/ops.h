// The CUDA backend's op launchers: one .cu per op (kernels, then these
// launchers), each mirroring the CPU reference named in its comment.
// Plain C++: no CUDA header, so tests and the backend include it freely.
//
// Shapes: kernels/shapes.h. Every pointer is device memory. Every launcher
// is asynchronous on `stream` (nullptr: the legacy default stream) and
// checks its launch (a bad configuration aborts with the CUDA error).
// Precision: bf16 weights and activations (stored as uint16_t bf16 bits in
// this header, __nv_bfloat16 in the kernels), fp32 gradients of parameters,
// fp32 master weights and AdamW moments, fp32 LayerNorm statistics and
// losses. No atomics in any reduction: results depend only on the inputs
// and the sizes, never on scheduling, so the same seed gives the same bits
// on the same GPU.
//
// Status: compiled and linked in CI; checked against the CPU references by
// tests/kernels/test_cuda_ops.cpp, which skips without a device. See the
// note at the top of that test for what has run on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace diloco::cuda {

using Stream = CUstream_st*;
using bf16 = uint16_t;  // bfloat16 bits (the high half of a float32)

// ---- conversions (convert.cu) ----
// out (n) = bf16(in) round-to-nearest-even / float(in).
void float_to_bf16(bf16* out, const float* in, size_t n, Stream stream);
void bf16_to_float(float* out, const bf16* in, size_t n, Stream stream);

// ---- embedding (encoder.cu; CPU: kernels/cpu/encoder.cpp) ----
// out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (T,C), summed in fp32.
void encoder_forward(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     Stream stream);

// The positions of a batch grouped by token, built on the host (the tokens
// come from the host anyway) so the backward needs no atomics:
// order[bucket_start[k] .. bucket_start[k+1]) are the positions (b*T+t),
// ascending, whose token is bucket_token[k]. bucket_start has one extra
// entry (= N) at the end.
struct TokenBuckets {
  std::vector<int> order, bucket_start, bucket_token;
  int num_buckets() const { return (int)bucket_token.size(); }
};
TokenBuckets build_token_buckets(const int* tokens, int N);

// ADDS to dwte (V,C) and dwpe (T,C) (fp32) from dout (B,T,C). One thread
// block per (token bucket, channel chunk) sums its positions in order; dwpe
// sums over b in order. order/bucket_start/bucket_token: device copies of a
// TokenBuckets of these tokens.
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const int* order, const int* bucket_start,
                      const int* bucket_token, int num_buckets, int B, int T, int C, Stream stream);

// ---- LayerNorm fused with the residual add (layernorm.cu; CPU: kernels/cpu/layernorm.cpp) ----
// With b: res_out (N,C) = a + b (rounded to bf16), then out (N,C) =
// LayerNorm(res_out); without b (nullptr): out = LayerNorm(a), res_out
// unused. Saves mean (N) and rstd (N) in fp32. Statistics in fp32 from the
// bf16-rounded residual, so backward sees exactly what forward normalised.
void layernorm_forward(bf16* res_out, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                       const bf16* weight, const bf16* bias, int N, int C, Stream stream);

// dinp (N,C): ADDS when accumulate (the residual stream's gradient: the add
// of the residual backward), else OVERWRITES. ADDS to dweight (C), dbias (C)
// (fp32) through a deterministic two-pass reduction in `scratch`, which
// holds layernorm_backward_scratch_floats(N, C) floats.
size_t layernorm_backward_scratch_floats(int N, int C);
void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                        const bf16* inp, const bf16* weight, const float* mean, const float* rstd, int N, int C,
                        bool accumulate, Stream stream);

// ---- GELU, tanh approximation (gelu.cu; CPU: kernels/cpu/gelu.cpp) ----
void gelu_forward(bf16* out, const bf16* inp, size_t n, Stream stream);
// OVERWRITES dinp (n).
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, size_t n, Stream stream);

// ---- residual add (residual.cu; CPU: kernels/cpu/residual.cpp) ----
void residual_forward(bf16* out, const bf16* a, const bf16* b, size_t n, Stream stream);

// ---- causal attention, fused online softmax (attention.cu; CPU: kernels/cpu/attention.cpp) ----
// Flash-style: the (T,T) probabilities are never stored. inp (B,T,3C) holds
// [q | k | v]; out (B,T,C); lse (B,NH,T) fp32 saves each row's
// log-sum-exp of the scaled scores for the backward. Tensor cores (bf16
// WMMA, fp32 accumulate) on tiles of 64 positions; any hs up to 128
// (padded to a multiple of 16 in shared memory).
constexpr int kMaxAttentionHeadSize = 128;
void attention_forward(bf16* out, float* lse, const bf16* inp, int B, int T, int C, int NH, Stream stream);

// OVERWRITES dinp (B,T,3C). Recomputes the probabilities from lse. Two
// kernels, so that no gradient is summed by atomics: one per key tile
// (dk, dv), one per query tile (dq). scratch: attention_backward_scratch_floats.
size_t attention_backward_scratch_floats(int B, int T, int NH);
void attention_backward(bf16* dinp, float* scratch, const bf16* dout, const bf16* inp, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, Stream stream);

// ---- fused classifier (classifier.cu; CPU: kernels/cpu/crossentropy.cpp) ----
// Per row of logits (N,V): losses[n] = logsumexp(logits[n]) - logits[n, targets[n]]
// (fp32). With dlogits: dlogits (N,V) = (softmax - onehot) * dloss, OVERWRITTEN,
// and dlogits may alias logits (in place). The probabilities are never
// stored: one pass for the max and sum, one that writes the gradient.
void classifier_forward_backward(bf16* dlogits, float* losses, const bf16* logits, const int* targets,
                                 float dloss, int N, int V, Stream stream);

// out[0] = sum(x[0..n)) / n (fp32 result of a double sum in fixed order; one block).
void mean_reduce(float* out, const float* x, int n, Stream stream);

// ---- bias gradient (bias.cu; CPU: the dbias loop of matmul_backward) ----
// ADDS to dbias (OC) the column sums of dout (N,OC). Deterministic two passes
// through scratch (bias_backward_scratch_floats(N, OC) floats).
size_t bias_backward_scratch_floats(int N, int OC);
void bias_backward(float* dbias, float* scratch, const bf16* dout, int N, int OC, Stream stream);

// out (N,OC) += bias (OC) broadcast over rows (the GEMM fallback when
// cuBLASLt has no bias epilogue for a shape).
void add_bias(bf16* out, const bf16* bias, int N, int OC, Stream stream);

// ---- AdamW on fp32 master weights (adamw.cu; CPU: kernels/cpu/adamw.cpp) ----
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  long step;  // 1-based, for bias correction
};
// The same update as adamw_update (kernels/adamw.h) over n elements; also
// writes params_bf16 (n) = bf16(params) when not null.
void adamw_update(float* params, bf16* params_bf16, float* m, float* v, const float* grads, size_t n,
                  const AdamWArgs& args, Stream stream);

// A run of elements sharing a weight-decay choice: the whole model's update
// in one launch, one block per chunk.
struct AdamWChunk {
  uint64_t offset;
  uint32_t numel;  // <= kAdamWChunkElems
  uint32_t decay;  // 1: args.weight_decay applies, 0: none
};
constexpr uint32_t kAdamWChunkElems = 1u << 16;
// Chunks covering [offset, offset + numel) with the given decay choice.
void append_adamw_chunks(std::vector<AdamWChunk>* chunks, size_t offset, size_t numel, bool decay);
void adamw_update_chunks(float* params, bf16* params_bf16, float* m, float* v, const float* grads,
                         const AdamWChunk* chunks, int num_chunks, const AdamWArgs& args, Stream stream);

// ---- global gradient norm (grad_norm.cu; CPU: kernels/cpu/grad_clip.cpp) ----
// out[0] = sum of x^2 in double: per-chunk partial sums (chunks of
// kNormChunk elements, as the CPU), then one block sums the partials in a
// fixed order. scratch holds global_norm_scratch_doubles(n) doubles.
constexpr size_t kNormChunk = 1 << 14;
size_t global_norm_scratch_doubles(size_t n);
void global_norm_squared(double* out, double* scratch, const float* x, size_t n, Stream stream);
// The two halves of global_norm_squared, for gradients sharded over a ring at
// chunk edges (kernels/shard.h): partial (ceil(n / kNormChunk) doubles) = each
// chunk's sum of squares of x (n); out[0] = the sum of `chunks` partials in
// global_norm_squared's order, so a ring that adds its ranks' partials (each
// chunk from one rank, zeros elsewhere) gets the unsharded bits.
void global_norm_chunk_sums(double* partial, const float* x, size_t n, Stream stream);
void global_norm_of_chunk_sums(double* out, const double* partial, size_t chunks, Stream stream);
// x (n) *= scale (clipping outside AdamW, or the mean of an all-reduce).
void scale_inplace(float* x, float scale, size_t n, Stream stream);

// ---- sync path (sync_ops.cu; CPU: kernels/cpu/sync_ops.cpp, kernels/sync_ops.h) ----
// delta (n) = base - theta.
void outer_delta(float* delta, const float* base, const float* theta, size_t n, Stream stream);
// The fold of a global fragment (kernels/sync_ops.h FoldMode numbering):
//   0 overwrite: theta = global
//   1 replay:    theta = global + (theta - theta_at_send)
//   2 mix:       theta = alpha * theta + (1 - alpha) * global
void fold(float* theta, const float* global, const float* theta_at_send, int mode, double alpha, size_t n,
          Stream stream);

// x (n) += a − b (each rounded once, a − b first), or x += a when b is null: a base plus a
// decoded update, θ at send moved with the base (the CPU loops of CpuBackend's sync ops).
void add_difference(float* x, const float* a, const float* b, size_t n, Stream stream);

// The wire codecs on the device, byte for byte the payloads of the CPU
// codec (daemon/net/codec.h; kernels/sync_ops.h is its reference in the
// engine). kind: 2 bf16, 3 int8, 4 int4 (CodecKind numbering); block: values
// per fp32 scale (int8/int4), even. payload holds
// sync_payload_bytes(kind, n, block) bytes.
//   sum = delta + residual (residual may be null: no error feedback)
//   payload = Encode(sum); residual = sum - Decode(payload) (when not null).
// *bad (a device int) is set to 0, or to 1 when some sum is NaN/Inf (or, for
// bf16, rounds to Inf): the payload is then not usable and, as in the CPU
// codec, the residual is left as it was (a second kernel updates it only
// when *bad is 0).
size_t sync_payload_bytes(int kind, size_t n, int block);
void sync_encode(uint8_t* payload, float* residual, int* bad, const float* delta, int kind, int block, size_t n,
                 Stream stream);
// out (n) = Decode(payload). Sets *bad to 0, or to 1 on what the CPU decoder rejects
// (negative, NaN, Inf or too-large scales; codes -128 / -8; a nonzero pad
// nibble; non-finite bf16) — out is then not usable.
void sync_decode(float* out, int* bad, const uint8_t* payload, int kind, int block, size_t n, Stream stream);

// ---- chunked top-k records (sync_sparse.cu; CPU: kernels/cpu/sync_sparse.cpp, kernels/sync_sparse.h) ----
// records (sparse_records_bytes(n, chunk, keep, bits) bytes, OVERWRITTEN) = the records of x (n)
// cut into chunks of `chunk` values, byte for byte sparse_encode_chunk's, chunk after chunk: the
// payload of one tensor of topk_chunked without its 8-byte header (daemon/net/codec.cpp frames
// it). keep in [1, chunk], bits 2, 4 or 8. scratch: sparse_encode_scratch_words(n, chunk, keep)
// device words (the kept indices). *bad (a device int) is set to 0, or to 1 when some value is
// NaN or Inf: the records are then not usable (the CPU codec refuses such input).
// Not wired into the learner yet: it encodes sparse uplinks on the host (LearnerCore::
// EncodeUplink), because their error feedback (the decaying accumulator) lives there; a device
// path needs that residual on the device too (TrainingBackend's sync ops).
size_t sparse_encode_scratch_words(size_t n, size_t chunk, size_t keep);
void sparse_encode(uint8_t* records, uint32_t* scratch, int* bad, const float* x, size_t n, size_t chunk,
                   size_t keep, int bits, Stream stream);

}  // namespace diloco::cuda
