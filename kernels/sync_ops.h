// The learner's sync-path ops on flat fp32 buffers (DESIGN.md §3):
//   outer delta   delta = base - theta
//   fold          theta <- the global fragment (overwrite / replay / mix)
//   codec         the dense wire codecs, with sender-side error feedback.
//
// kernels/cpu/sync_ops.cpp is THE implementation on the CPU: the wire codec
// (daemon/net/codec.h: top-k, tensors, framing, Status errors) and the
// daemon's fold (daemon/sync/fold.h) call it; kernels/cuda/sync_ops.cu is
// tested byte-identical to it (tests/kernels/test_cuda_ops.cpp).
//
// Layouts (little-endian), B = block (even), n values:
//   fp32  n x float32
//   bf16  n x bfloat16
//   int8  ceil(n/B) x float32 scale, then n x int8 in [-127, 127]
//   int4  ceil(n/B) x float32 scale = absmax, then ceil(n/2) bytes, two codes
//         0..15 per byte, low nibble first (odd n: the last high nibble 0)
//
// THE ARITHMETIC (pinned: every site, CPU or GPU, whatever its compiler
// flags, writes the same bytes; fl() = one IEEE fp32 round-to-nearest-even):
//   bf16  r = (b + 0x7fff + ((b >> 16) & 1)) >> 16 on the float's bits b:
//         round-to-nearest-even of the mantissa (an integer computation);
//         r with |r| >= 0x7f80 (the value rounds to Inf) is refused.
//   block absmax = max |x| over the block (exact). A block is "zero" when
//         fl(127 / absmax) is not finite (all zero, or absmax < ~3.7e-37):
//         scale 0; int8 codes 0, int4 codes 8 (the value x * 0 is +-0).
//   int8  inv = fl(127 / absmax), scale = min(fl(absmax / 127), sync_max_scale(127)),
//         code = clamp(round-half-even(x * inv), -127, 127) where x * inv is the
//         EXACT product, never a rounded one (a tie is a product exactly k + 1/2).
//         CPU: the product in double (exact: 24 + 24 bits), + 1.5 * 2^52;
//         CUDA: __fmaf_rn(x, inv, 1.5 * 2^23). Both = the rounding of the exact
//         product, so FMA contraction cannot change it.
//   int4  inv = fl(1 / absmax), scale = absmax, v = fl(x * inv);
//         mid_k = fl(0.5 * fl(L[8+k] + L[9+k])), k = 0..6 (L = kSyncInt4Levels);
//         m = #{k : |v| > mid_k}; code = 8 + m for v >= 0 (also -0), 7 - m for v < 0
//         (a value exactly on a midpoint takes the level nearer to zero).
//   decode  int8 fl(code * scale); int4 fl(L[code] * scale); fp32/bf16 exact.
//   error feedback  sum = fl(residual + delta); residual = fl(sum - decode(payload)).
//   outer delta  fl(base - theta).
//   fold  overwrite theta = global; replay theta = fl(global + fl(theta - theta_at_send));
//         mix theta = fma(a, theta, fl(b * global)) (one rounding for the fused
//         multiply-add), a = fl32(alpha), b = fl32(1 - alpha) with 1 - alpha in double.
// kernels/cpu/sync_ops.cpp is compiled with -ffp-contract=off and uses std::fma
// where the rule has an FMA; sync_ops.cu spells every step as an _rn intrinsic.
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

// theta (n) in place (=); theta_at_send is read by kReplay only, alpha by kMix
// only (a double: b = fl32(1 - alpha) as above; a float alpha gives 1.0f - alpha).
void fold(float* theta, const float* global, const float* theta_at_send, FoldMode mode, double alpha, size_t n);

// Codec numbering = daemon/net/codec_kind.h CodecKind (the wire's).
enum class SyncCodec : int { kFp32 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4 };

// int4 code c decodes to kSyncInt4Levels[c] * scale, scale = the block's
// absmax: the 16 Lloyd-Max levels of a Gaussian (Max 1960) scaled to +-1,
// ascending, kSyncInt4Levels[15 - c] == -kSyncInt4Levels[c].
inline constexpr float kSyncInt4Levels[16] = {
    -1.0f,      -0.7571544f, -0.5921467f, -0.4597087f, -0.344873f, -0.2403572f, -0.1420259f, -0.0469882f,
    0.0469882f, 0.1420259f,  0.2403572f,  0.344873f,   0.4597087f, 0.5921467f,  0.7571544f,  1.0f};

// The largest scale s with s * qmax finite (the int8 codec clamps scales to it).
float sync_max_scale(int qmax);

size_t sync_payload_bytes(SyncCodec kind, size_t n, int block);

// What a dense encode or decode refused, and where (*index):
enum class SyncFault : int {
  kNone = 0,
  kNonFinite,     // encode: input NaN/Inf; decode: fp32/bf16 value NaN/Inf. index: that value
  kBf16Overflow,  // encode: a finite value that rounds to Inf in bf16. index: that value
  kBadScale,      // decode: scale negative, NaN, Inf or too large. index: its block's first value
  kBadCode,       // decode: int8 code -128 (never written). index: that value
  kBadPad,        // decode: int4 pad nibble of an odd n not 0. index: n
};

// payload (sync_payload_bytes) = Encode(x (n)), no error feedback. The first
// offending value (in index order) decides the fault; the payload is then
// unspecified. index may be null.
SyncFault sync_encode_dense(uint8_t* payload, const float* x, SyncCodec kind, int block, size_t n, size_t* index);

// out (n) = Decode(payload), OVERWRITTEN. Checks, in this order: the scales
// (first bad block), then the codes (int8: first -128; int4: the pad nibble);
// fp32/bf16: the first NaN/Inf. On a fault out is unspecified. index may be null.
SyncFault sync_decode_dense(float* out, const uint8_t* payload, SyncCodec kind, int block, size_t n, size_t* index);

// The dense int8 / int4 codecs with the payload's two parts apart: scales (ceil(n / block) fp32)
// and codes (n or ceil(n / 2) bytes). A few blocks of a larger payload are encoded or decoded in
// place this way (a piece of a tensor per thread; a reader of some blocks), without gathering
// them into one buffer. CPU only.
SyncFault sync_encode_blocks(uint8_t* scales, uint8_t* codes, const float* x, SyncCodec kind, int block, size_t n,
                             size_t* index);
SyncFault sync_decode_blocks(float* out, const uint8_t* scales, const uint8_t* codes, SyncCodec kind, int block,
                             size_t n, size_t* index);

// sum = delta + residual (residual may be null); payload = Encode(sum);
// residual = sum - Decode(payload). Returns false, leaving the residual
// unchanged, when some sum is NaN/Inf or (bf16) rounds to Inf.
bool sync_encode(uint8_t* payload, float* residual, const float* delta, SyncCodec kind, int block, size_t n);

// out (n) = Decode(payload), OVERWRITTEN. Returns false on a payload the
// encoder never writes (sync_decode_dense != kNone).
bool sync_decode(float* out, const uint8_t* payload, SyncCodec kind, int block, size_t n);

}  // namespace diloco
