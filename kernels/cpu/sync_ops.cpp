// The sync-path ops on the CPU: THE implementation of the fold and of the
// dense codecs (kernels/sync_ops.h states the arithmetic; the wire codec,
// daemon/net/codec.cpp, calls these). Compiled with -ffp-contract=off
// (kernels/CMakeLists.txt): every float operation below rounds where it is
// written, whatever -march says; the one FMA of the rules is std::fma.
//
// The loops are plain branch-free loops GCC vectorizes at -O3:
// - absmax and the NaN/Inf check are one unsigned max over the float bits with
//   the sign cleared (order-preserving for finite values; >= 0x7f800000 means
//   NaN or Inf);
// - int8 codes: the exact product in double plus 1.5 * 2^52, the integer read
//   off the low bits (round-half-even, no FMA needed, vectorizes without one);
// - payload floats and uint16s are read and written with memcpy (payloads are
//   unaligned);
// - one exception, the int4 decoder's 16-entry table lookup: GCC turns it into
//   gathers (~3 GB/s), so with AVX-512 it is one vpermps per 16 values (the
//   table fits one register; the same lookup and multiply, the same floats).
#include "kernels/sync_ops.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace diloco {

namespace {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr uint16_t kBf16InfBits = 0x7f80u;

template <typename T>
inline T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
inline void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

inline uint32_t abs_bits(float x) { return std::bit_cast<uint32_t>(x) & kAbsMask; }

size_t num_blocks(size_t n, int block) { return (n + block - 1) / block; }

void set_index(size_t* index, size_t i) {
  if (index) *index = i;
}

// ---- the pinned roundings (kernels/sync_ops.h) ----

// bf16 bits of x, round-to-nearest-even on the bits.
inline uint32_t bf16_bits(uint32_t b) { return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16; }

// round-half-even of the EXACT product x * inv: in double the product is exact
// (24 + 24 significant bits), and adding 1.5 * 2^52 leaves the integer in the
// low mantissa bits (|x * inv| < 2^51). A fused or unfused add of an exact
// product rounds the same, so no compiler flag changes this.
inline int32_t round_product_half_even(float x, float inv) {
  const double p = static_cast<double>(x) * static_cast<double>(inv);
  return static_cast<int32_t>(std::bit_cast<int64_t>(p + 0x1.8p52) - 0x4338000000000000);
}

// int4: m = how many of the 7 positive midpoints |v| exceeds picks level 8 + m
// (v >= 0) or 7 - m = (8 + m) ^ 15 (v < 0).
constexpr float mid(int k) { return 0.5f * (kSyncInt4Levels[8 + k] + kSyncInt4Levels[9 + k]); }
inline uint32_t int4_code(float v) {
  const float a = std::fabs(v);
  const uint32_t m = (a > mid(0)) + (a > mid(1)) + (a > mid(2)) + (a > mid(3)) + (a > mid(4)) + (a > mid(5)) +
                     (a > mid(6));
  return (8 + m) ^ (v < 0.0f ? 15u : 0u);
}

// ---- loops ----

// max |x[i]| as float bits; >= kInfBits when some value is NaN or Inf.
uint32_t abs_max_bits(const float* __restrict x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, abs_bits(x[i]));
  return m;
}

size_t first_non_finite(const float* x, size_t n) {
  size_t i = 0;
  while (i < n && abs_bits(x[i]) < kInfBits) ++i;
  return i;
}

// max of n little-endian uint32 at p.
uint32_t max_u32(const uint8_t* __restrict p, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, load<uint32_t>(p + 4 * i));
  return m;
}

// Negative when some code is -128 (never written by the int8 encoder).
int8_t min_int8(const int8_t* __restrict q, size_t n) {
  int8_t m = 0;
  for (size_t i = 0; i < n; ++i) m = q[i] < m ? q[i] : m;
  return m;
}

void quantize_int8(int8_t* __restrict q, const float* __restrict x, size_t n, float inv) {
  for (size_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::clamp(round_product_half_even(x[i], inv), -127, 127));
}

// x has 2 * pairs values; byte j = code(x[2j]) | code(x[2j+1]) << 4.
void quantize_int4_pairs(uint8_t* __restrict q, const float* __restrict x, size_t pairs, float inv) {
  for (size_t j = 0; j < pairs; ++j)
    q[j] = static_cast<uint8_t>(int4_code(x[2 * j] * inv) | (int4_code(x[2 * j + 1] * inv) << 4));
}

void dequantize_int8(float* __restrict x, const int8_t* __restrict q, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(q[i]) * scale;
}

void dequantize_int4_pairs(float* __restrict x, const uint8_t* __restrict q, size_t pairs, float scale) {
  size_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 table = _mm512_loadu_ps(kSyncInt4Levels);
  const __m512 s = _mm512_set1_ps(scale);
  const __m128i low4 = _mm_set1_epi8(15);
  for (; j + 16 <= pairs; j += 16) {  // 16 bytes -> 32 values
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + j));
    const __m128i lo = _mm_and_si128(b, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
    // Codes in value order: byte j's low nibble, then its high nibble.
    const __m512i c0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    const __m512i c1 = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi));
    _mm512_storeu_ps(x + 2 * j, _mm512_mul_ps(_mm512_permutexvar_ps(c0, table), s));
    _mm512_storeu_ps(x + 2 * j + 16, _mm512_mul_ps(_mm512_permutexvar_ps(c1, table), s));
  }
#endif
  for (; j < pairs; ++j) {
    x[2 * j] = kSyncInt4Levels[q[j] & 15] * scale;
    x[2 * j + 1] = kSyncInt4Levels[q[j] >> 4] * scale;
  }
}

// Nonzero when some input was NaN/Inf or rounded to Inf.
uint32_t encode_bf16(uint8_t* __restrict out, const float* __restrict x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]);
    const uint32_t r = bf16_bits(b);
    store<uint16_t>(out + 2 * i, static_cast<uint16_t>(r));
    bad |= static_cast<uint32_t>((b & kAbsMask) >= kInfBits) | static_cast<uint32_t>((r & 0x7fffu) >= kBf16InfBits);
  }
  return bad;
}

// The largest |h| (sign cleared) of the decoded bf16s.
uint16_t decode_bf16(float* __restrict x, const uint8_t* __restrict in, size_t n) {
  uint16_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = load<uint16_t>(in + 2 * i);
    m = std::max(m, static_cast<uint16_t>(h & 0x7fffu));
    x[i] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
  }
  return m;
}

uint32_t copy_to_payload(uint8_t* __restrict out, const float* __restrict x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    m = std::max(m, abs_bits(x[i]));
    store<float>(out + 4 * i, x[i]);
  }
  return m;
}

uint32_t copy_from_payload(float* __restrict x, const uint8_t* __restrict in, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = load<float>(in + 4 * i);
    m = std::max(m, abs_bits(v));
    x[i] = v;
  }
  return m;
}

SyncFault encode_blocks(uint8_t* scales, uint8_t* codes, const float* x, bool int8, int block, size_t n,
                        size_t* index) {
  const size_t nb = num_blocks(n, block);
  const float max_scale = sync_max_scale(127);
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * static_cast<size_t>(block);
    const size_t len = std::min<size_t>(block, n - lo);
    const uint32_t amax_bits = abs_max_bits(x + lo, len);
    if (amax_bits >= kInfBits) {
      set_index(index, lo + first_non_finite(x + lo, len));
      return SyncFault::kNonFinite;
    }
    const float amax = std::bit_cast<float>(amax_bits);
    // Zero or tiny (< 127 / FLT_MAX ~ 3.7e-37) block: scale 0, decodes to zeros.
    const bool zero = !(127.0f / amax <= FLT_MAX);
    if (int8) {
      store<float>(scales + 4 * b, zero ? 0.0f : std::min(amax / 127.0f, max_scale));
      quantize_int8(reinterpret_cast<int8_t*>(codes) + lo, x + lo, len, zero ? 0.0f : 127.0f / amax);
    } else {
      // int4: the scale is the absmax itself (the outermost levels are +-1).
      const float inv = zero ? 0.0f : 1.0f / amax;
      store<float>(scales + 4 * b, zero ? 0.0f : amax);
      uint8_t* q = codes + lo / 2;  // lo is even: B is
      quantize_int4_pairs(q, x + lo, len / 2, inv);
      if (len % 2 != 0) q[len / 2] = static_cast<uint8_t>(int4_code(x[lo + len - 1] * inv));  // pad nibble 0
    }
  }
  return SyncFault::kNone;
}

SyncFault decode_blocks(float* x, const uint8_t* scales, const uint8_t* codes, bool int8, int block, size_t n,
                        size_t* index) {
  const size_t nb = num_blocks(n, block);
  // int4 levels are within [-1, 1]: any finite scale decodes to finite values.
  const uint32_t max_scale_bits = std::bit_cast<uint32_t>(int8 ? sync_max_scale(127) : FLT_MAX);
  // One unsigned max covers negative (sign bit), NaN/Inf and too-large scales.
  if (max_u32(scales, nb) > max_scale_bits) {
    size_t b = 0;
    while (load<uint32_t>(scales + 4 * b) <= max_scale_bits) ++b;
    set_index(index, b * block);
    return SyncFault::kBadScale;
  }
  if (int8) {
    const auto* q = reinterpret_cast<const int8_t*>(codes);
    if (min_int8(q, n) < -127) {
      size_t i = 0;
      while (q[i] >= -127) ++i;
      set_index(index, i);
      return SyncFault::kBadCode;
    }
    for (size_t b = 0; b < nb; ++b) {
      const size_t lo = b * static_cast<size_t>(block);
      dequantize_int8(x + lo, q + lo, std::min<size_t>(block, n - lo), load<float>(scales + 4 * b));
    }
    return SyncFault::kNone;
  }
  if (n % 2 != 0 && (codes[n / 2] >> 4) != 0) {
    set_index(index, n);
    return SyncFault::kBadPad;
  }
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * static_cast<size_t>(block);
    const size_t len = std::min<size_t>(block, n - lo);
    const float scale = load<float>(scales + 4 * b);
    dequantize_int4_pairs(x + lo, codes + lo / 2, len / 2, scale);
    if (len % 2 != 0) x[lo + len - 1] = kSyncInt4Levels[codes[(lo + len - 1) / 2] & 15] * scale;
  }
  return SyncFault::kNone;
}

}  // namespace

void outer_delta(float* delta, const float* base, const float* theta, size_t n) {
  for (size_t i = 0; i < n; i++) delta[i] = base[i] - theta[i];
}

void fold(float* theta, const float* global, const float* theta_at_send, FoldMode mode, double alpha, size_t n) {
  switch (mode) {
    case FoldMode::kOverwrite:
      if (n > 0) std::memmove(theta, global, n * sizeof(float));
      break;
    case FoldMode::kReplay:
      for (size_t i = 0; i < n; i++) theta[i] = global[i] + (theta[i] - theta_at_send[i]);
      break;
    case FoldMode::kMix: {
      const float a = static_cast<float>(alpha), b = static_cast<float>(1.0 - alpha);
      for (size_t i = 0; i < n; i++) theta[i] = std::fma(a, theta[i], b * global[i]);
      break;
    }
  }
}

float sync_max_scale(int qmax) {
  float s = FLT_MAX / static_cast<float>(qmax);
  while (!std::isfinite(s * static_cast<float>(qmax))) s = std::nextafter(s, 0.0f);
  return s;
}

size_t sync_payload_bytes(SyncCodec kind, size_t n, int block) {
  switch (kind) {
    case SyncCodec::kFp32: return 4 * n;
    case SyncCodec::kBf16: return 2 * n;
    case SyncCodec::kInt8: return 4 * num_blocks(n, block) + n;
    case SyncCodec::kInt4: return 4 * num_blocks(n, block) + (n + 1) / 2;
  }
  return 0;
}

SyncFault sync_encode_dense(uint8_t* payload, const float* x, SyncCodec kind, int block, size_t n, size_t* index) {
  switch (kind) {
    case SyncCodec::kFp32:
      if (copy_to_payload(payload, x, n) < kInfBits) return SyncFault::kNone;
      set_index(index, first_non_finite(x, n));
      return SyncFault::kNonFinite;
    case SyncCodec::kBf16: {
      if (encode_bf16(payload, x, n) == 0) return SyncFault::kNone;
      size_t i = 0;  // the first value that is NaN/Inf or rounds to Inf
      while (abs_bits(x[i]) < kInfBits && (bf16_bits(std::bit_cast<uint32_t>(x[i])) & 0x7fffu) < kBf16InfBits) ++i;
      set_index(index, i);
      return abs_bits(x[i]) >= kInfBits ? SyncFault::kNonFinite : SyncFault::kBf16Overflow;
    }
    case SyncCodec::kInt8:
    case SyncCodec::kInt4:
      return encode_blocks(payload, payload + 4 * num_blocks(n, block), x, kind == SyncCodec::kInt8, block, n, index);
  }
  return SyncFault::kNone;
}

SyncFault sync_decode_dense(float* out, const uint8_t* payload, SyncCodec kind, int block, size_t n, size_t* index) {
  switch (kind) {
    case SyncCodec::kFp32:
      if (copy_from_payload(out, payload, n) < kInfBits) return SyncFault::kNone;
      set_index(index, first_non_finite(out, n));
      return SyncFault::kNonFinite;
    case SyncCodec::kBf16:
      if (decode_bf16(out, payload, n) < kBf16InfBits) return SyncFault::kNone;
      set_index(index, first_non_finite(out, n));
      return SyncFault::kNonFinite;
    case SyncCodec::kInt8:
    case SyncCodec::kInt4:
      return decode_blocks(out, payload, payload + 4 * num_blocks(n, block), kind == SyncCodec::kInt8, block, n,
                           index);
  }
  return SyncFault::kNone;
}

SyncFault sync_encode_blocks(uint8_t* scales, uint8_t* codes, const float* x, SyncCodec kind, int block, size_t n,
                             size_t* index) {
  return encode_blocks(scales, codes, x, kind == SyncCodec::kInt8, block, n, index);
}

SyncFault sync_decode_blocks(float* out, const uint8_t* scales, const uint8_t* codes, SyncCodec kind, int block,
                             size_t n, size_t* index) {
  return decode_blocks(out, scales, codes, kind == SyncCodec::kInt8, block, n, index);
}

bool sync_encode(uint8_t* payload, float* residual, const float* delta, SyncCodec kind, int block, size_t n) {
  std::vector<float> sum(delta, delta + n);
  if (residual)
    for (size_t i = 0; i < n; i++) sum[i] = residual[i] + delta[i];
  if (sync_encode_dense(payload, sum.data(), kind, block, n, nullptr) != SyncFault::kNone) return false;
  if (residual) {
    std::vector<float> decoded(n);
    if (!sync_decode(decoded.data(), payload, kind, block, n)) return false;
    for (size_t i = 0; i < n; i++) residual[i] = sum[i] - decoded[i];
  }
  return true;
}

bool sync_decode(float* out, const uint8_t* payload, SyncCodec kind, int block, size_t n) {
  return sync_decode_dense(out, payload, kind, block, n, nullptr) == SyncFault::kNone;
}

}  // namespace diloco
