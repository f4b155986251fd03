// The learner's sync-path ops on flat fp32 buffers (DESIGN.md §3), CPU
// reference for kernels/cuda/sync_ops.cu:
//   outer delta   delta = base - theta
//   fold          theta <- the global fragment (overwrite / replay / mix)
//   codec         the dense wire codecs with sender-side error feedback.
//
// The codec here is a plain-loop restatement of daemon/net/codec.h's dense
// codecs (kernels know nothing of daemon/), byte for byte the same payloads;
// tests/kernels/test_sync_ops.cpp checks that against daemon/net/codec.cpp.
// Layouts (little-endian), B = block (even), n values:
//   fp32  n x float32
//   bf16  n x bfloat16, round-to-nearest-even
//   int8  ceil(n/B) x float32 scale, then n x int8 in [-127, 127]
//   int4  ceil(n/B) x float32 scale = absmax, then ceil(n/2) bytes, two codes
//         0..15 per byte, low nibble first (odd n: the last high nibble 0);
//         code = the nearest of 16 fixed levels (Lloyd-Max for a Gaussian,
//         scaled to +-1) to x * (1/absmax), value = level * scale
// int8: scale = min(absmax/qmax, largest finite-safe scale); code =
// round-half-even of the exact product x * (qmax/absmax) (a fused
// multiply-add with 1.5*2^23, as the wire codec compiles with FMA
// contraction); a block whose qmax/absmax overflows (all zero, or
// absmax < ~3.7e-37) has scale 0 and codes 0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace diloco {

enum class FoldMode : int {
  kOverwrite = 0,  // theta = global (the paper's default)
  kReplay = 1,     // theta = global + (theta - theta_at_send): keep local progress made in flight
  kMix = 2,        // theta = alpha * theta + (1 - alpha) * global
};

// delta (n) = base - theta.
void outer_delta(float* delta, const float* base, const float* theta, size_t n);

// theta (n) in place; theta_at_send is read by kReplay only, alpha by kMix only.
void fold(float* theta, const float* global, const float* theta_at_send, FoldMode mode, float alpha, size_t n);

// Codec numbering = daemon/net/codec_kind.h CodecKind (the wire's).
enum class SyncCodec : int { kFp32 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4 };

// The largest scale s with s * qmax finite (the codec clamps scales to it).
float sync_max_scale(int qmax);

size_t sync_payload_bytes(SyncCodec kind, size_t n, int block);

// sum = delta + residual (residual may be null); payload = Encode(sum);
// residual = sum - Decode(payload). Returns false, leaving the residual
// unchanged, when some sum is NaN/Inf or (bf16) rounds to Inf.
bool sync_encode(uint8_t* payload, float* residual, const float* delta, SyncCodec kind, int block, size_t n);

// out (n) = Decode(payload), OVERWRITTEN. Returns false on a payload the
// encoder never writes (bad scale, int8 code -128, nonzero int4 pad nibble,
// non-finite float).
bool sync_decode(float* out, const uint8_t* payload, SyncCodec kind, int block, size_t n);

}  // namespace diloco
