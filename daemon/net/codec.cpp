// Codecs: see codec.h for the formats. The hot loops are plain branch-free loops that GCC
// vectorizes at -O3 (check with -fopt-info-vec-optimized):
// - absmax and the NaN/Inf check are one unsigned max over the float bits with the sign cleared
//   (order-preserving for finite values; >= 0x7f800000 means NaN or Inf);
// - round-half-even is x + 1.5*2^23 (exact for |x| < 2^22), the integer read off the low bits;
// - payload floats and uint16s are read and written with memcpy (payloads are unaligned);
// - one exception, the int4 decoder's 16-entry table lookup: GCC turns it into gathers (~3 GB/s),
//   so with AVX-512 it is one vpermps per 16 values (the table fits one register).
#include "daemon/net/codec.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace diloco {
namespace {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

// Payload bytes have no alignment: every multi-byte access is a memcpy (one mov, or a vector
// lane, once compiled).
template <typename T>
inline T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
constexpr int32_t kRoundMagicBits = 0x4b400000;
constexpr uint8_t kIndexBitmap = 1;
constexpr uint8_t kIndexDelta = 2;

std::string KindName(CodecKind kind) { return std::string(CodecName(kind)); }

Status CheckBlockSize(int block_size) {
  if (block_size < kMinCodecBlockSize || block_size > kMaxCodecBlockSize || block_size % 2 != 0) {
    return Status::Error("codec block_size " + std::to_string(block_size) + " is invalid: use an even number in [" +
                         std::to_string(kMinCodecBlockSize) + ", " + std::to_string(kMaxCodecBlockSize) +
                         "] (64-256 is typical)");
  }
  return Status::Ok();
}

size_t NumBlocks(size_t n, int block_size) { return (n + block_size - 1) / block_size; }

// What this file writes; must equal EncodedBytes() (checked on every call, and by the tests).
size_t LayoutBytes(CodecKind kind, size_t n, int block_size) {
  switch (kind) {
    case CodecKind::kFp32:
      return 4 * n;
    case CodecKind::kBf16:
      return 2 * n;
    case CodecKind::kInt8:
      return 4 * NumBlocks(n, block_size) + n;
    case CodecKind::kInt4:
      return 4 * NumBlocks(n, block_size) + (n + 1) / 2;
  }
  return 0;
}

// The largest scale s with q * s finite for |q| <= qmax.
float MaxScale(int qmax) {
  float s = FLT_MAX / static_cast<float>(qmax);
  while (!std::isfinite(s * static_cast<float>(qmax))) s = std::nextafter(s, 0.0f);
  return s;
}

// ---- kernels ----

// max |x[i]| as float bits; >= kInfBits when some value is NaN or Inf.
uint32_t AbsMaxBits(const float* __restrict x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
    m = b > m ? b : m;
  }
  return m;
}

// max of n little-endian uint32 at p.
uint32_t MaxU32(const uint8_t* __restrict p, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = Load<uint32_t>(p + 4 * i);
    m = v > m ? v : m;
  }
  return m;
}

inline int32_t RoundHalfEven(float v) { return std::bit_cast<int32_t>(v + kRoundMagic) - kRoundMagicBits; }

void QuantizeInt8(const float* __restrict x, size_t n, float inv_scale, int8_t* __restrict q) {
  for (size_t i = 0; i < n; ++i) {
    int32_t v = RoundHalfEven(x[i] * inv_scale);
    v = v < -127 ? -127 : v;
    v = v > 127 ? 127 : v;
    q[i] = static_cast<int8_t>(v);
  }
}

// int4: the nearest of kInt4Levels to v = x / absmax. By symmetry, m = how many of the 7
// positive midpoints |v| exceeds picks the level 8 + m (v >= 0) or 7 - m = (8 + m) ^ 15 (v < 0).
// A value exactly on a midpoint takes the level nearer to zero.
constexpr float Mid(int k) { return 0.5f * (kInt4Levels[8 + k] + kInt4Levels[9 + k]); }
inline uint32_t Int4Code(float v) {
  const float a = std::fabs(v);
  const uint32_t m = (a > Mid(0)) + (a > Mid(1)) + (a > Mid(2)) + (a > Mid(3)) + (a > Mid(4)) +
                     (a > Mid(5)) + (a > Mid(6));
  return (8 + m) ^ (v < 0.0f ? 15u : 0u);
}

// x has 2 * pairs values; byte j = code(x[2j]) | code(x[2j+1]) << 4.
void QuantizeInt4Pairs(const float* __restrict x, size_t pairs, float inv_scale, uint8_t* __restrict q) {
  for (size_t j = 0; j < pairs; ++j) {
    const uint32_t a = Int4Code(x[2 * j] * inv_scale);
    const uint32_t b = Int4Code(x[2 * j + 1] * inv_scale);
    q[j] = static_cast<uint8_t>(a | (b << 4));
  }
}

void DequantizeInt8(const int8_t* __restrict q, size_t n, float scale, float* __restrict x) {
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(q[i]) * scale;
}

void DequantizeInt4Pairs(const uint8_t* __restrict q, size_t pairs, float scale, float* __restrict x) {
  size_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 table = _mm512_loadu_ps(kInt4Levels);
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
    x[2 * j] = kInt4Levels[q[j] & 15] * scale;
    x[2 * j + 1] = kInt4Levels[q[j] >> 4] * scale;
  }
}

// Nonzero when some code is -128 (never written by the int8 encoder).
int8_t MinInt8(const int8_t* __restrict q, size_t n) {
  int8_t m = 0;
  for (size_t i = 0; i < n; ++i) m = q[i] < m ? q[i] : m;
  return m;
}

// Returns the OR of "input was NaN/Inf" and "rounded to Inf" flags.
uint32_t EncodeBf16(const float* __restrict x, size_t n, uint8_t* __restrict out) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]);
    const uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    Store<uint16_t>(out + 2 * i, static_cast<uint16_t>(r));
    bad |= static_cast<uint32_t>((b & kAbsMask) >= kInfBits) | static_cast<uint32_t>((r & 0x7fffu) >= 0x7f80u);
  }
  return bad;
}

uint16_t DecodeBf16(const uint8_t* __restrict in, size_t n, float* __restrict x) {
  uint16_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = Load<uint16_t>(in + 2 * i);
    const uint16_t a = static_cast<uint16_t>(h & 0x7fffu);
    m = a > m ? a : m;
    x[i] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
  }
  return m;
}

uint32_t CopyToPayload(const float* __restrict x, size_t n, uint8_t* __restrict out) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
    m = b > m ? b : m;
    Store<float>(out + 4 * i, x[i]);
  }
  return m;
}

uint32_t CopyFromPayload(const uint8_t* __restrict in, size_t n, float* __restrict x) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = Load<float>(in + 4 * i);
    const uint32_t b = std::bit_cast<uint32_t>(v) & kAbsMask;
    m = b > m ? b : m;
    x[i] = v;
  }
  return m;
}

// ---- errors ----

Status NonFiniteError(const float* x, size_t n, size_t offset) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      return Status::Error("value at index " + std::to_string(offset + i) + " is " +
                           (std::isnan(x[i]) ? "NaN" : "Inf") +
                           ": a delta must be finite; check the learner's loss and gradients");
    }
  }
  return Status::Error("non-finite value in the input");
}

Status Bf16Error(const float* x, size_t n) {
  Status st = NonFiniteError(x, n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) {
      const uint32_t b = std::bit_cast<uint32_t>(x[i]);
      const uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
      if ((r & 0x7fffu) >= 0x7f80u) {
        return Status::Error("value at index " + std::to_string(i) + " (" + std::to_string(x[i]) +
                             ") overflows bf16; use fp32 for such values");
      }
    } else {
      return st;
    }
  }
  return st;
}

Status PayloadError(const char* what, CodecKind kind, size_t index) {
  return Status::Error(KindName(kind) + " payload: " + what + " at index " + std::to_string(index) +
                       "; the sender's encoder or the link corrupted it (drop the message)");
}

// ---- dense codecs ----

Status EncodeBlocks(CodecKind kind, int block_size, const float* x, size_t n, uint8_t* out) {
  const size_t nb = NumBlocks(n, block_size);
  uint8_t* codes = out + 4 * nb;
  const bool int8 = kind == CodecKind::kInt8;
  const float max_scale = MaxScale(127);
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * static_cast<size_t>(block_size);
    const size_t len = std::min<size_t>(block_size, n - lo);
    const uint32_t amax_bits = AbsMaxBits(x + lo, len);
    if (amax_bits >= kInfBits) return NonFiniteError(x + lo, len, lo);
    const float amax = std::bit_cast<float>(amax_bits);
    // Zero or tiny (< 127 / FLT_MAX ~ 3.7e-37) block: scale 0, decodes to zeros.
    const bool zero = !(127.0f / amax <= FLT_MAX);
    if (int8) {
      const float inv_scale = zero ? 0.0f : 127.0f / amax;
      Store<float>(out + 4 * b, zero ? 0.0f : std::min(amax / 127.0f, max_scale));
      QuantizeInt8(x + lo, len, inv_scale, reinterpret_cast<int8_t*>(codes) + lo);
    } else {
      // int4: the scale is the absmax itself (the outermost levels are +-1).
      const float inv_scale = zero ? 0.0f : 1.0f / amax;
      Store<float>(out + 4 * b, zero ? 0.0f : amax);
      uint8_t* q = codes + lo / 2;
      QuantizeInt4Pairs(x + lo, len / 2, inv_scale, q);
      if (len % 2 != 0) {  // only the last block of an odd n: the high pad nibble stays 0
        q[len / 2] = static_cast<uint8_t>(Int4Code(x[lo + len - 1] * inv_scale));
      }
    }
  }
  return Status::Ok();
}

Status DecodeBlocks(CodecKind kind, int block_size, const uint8_t* in, size_t n, float* x) {
  const size_t nb = NumBlocks(n, block_size);
  const uint8_t* codes = in + 4 * nb;
  const bool int8 = kind == CodecKind::kInt8;
  // int4 levels are within [-1, 1]: any finite scale decodes to finite values.
  const uint32_t max_scale_bits = std::bit_cast<uint32_t>(int8 ? MaxScale(127) : FLT_MAX);
  // One unsigned max covers negative (sign bit), NaN/Inf and too-large scales.
  if (MaxU32(in, nb) > max_scale_bits) {
    for (size_t b = 0; b < nb; ++b) {
      if (Load<uint32_t>(in + 4 * b) > max_scale_bits) {
        return PayloadError("scale is negative, NaN, Inf or too large", kind, b * block_size);
      }
    }
  }
  if (int8) {
    const auto* q = reinterpret_cast<const int8_t*>(codes);
    if (MinInt8(q, n) < -127) {
      for (size_t i = 0; i < n; ++i)
        if (q[i] < -127) return PayloadError("code -128", kind, i);
    }
    for (size_t b = 0; b < nb; ++b) {
      const size_t lo = b * static_cast<size_t>(block_size);
      DequantizeInt8(q + lo, std::min<size_t>(block_size, n - lo), Load<float>(in + 4 * b), x + lo);
    }
    return Status::Ok();
  }
  const size_t code_bytes = (n + 1) / 2;
  if (n % 2 != 0 && (codes[code_bytes - 1] >> 4) != 0) return PayloadError("nonzero pad nibble", kind, n);
  for (size_t b = 0; b < nb; ++b) {
    const size_t lo = b * static_cast<size_t>(block_size);
    const size_t len = std::min<size_t>(block_size, n - lo);
    const float scale = Load<float>(in + 4 * b);
    DequantizeInt4Pairs(codes + lo / 2, len / 2, scale, x + lo);
    if (len % 2 != 0) {
      x[lo + len - 1] = kInt4Levels[codes[(lo + len - 1) / 2] & 15] * scale;
    }
  }
  return Status::Ok();
}

// ---- top-k ----

size_t VarintBytes(uint64_t v) {
  size_t bytes = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++bytes;
  }
  return bytes;
}

uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// The k values of largest |x| (ties: lower index first), ascending indices. x must be finite.
// Radix select on the sign-cleared bits: a histogram of the high 16 bits finds the threshold's
// bin, a second one of the low 16 bits within that bin finds the threshold itself.
void SelectTopk(const float* x, size_t n, size_t k, std::vector<size_t>* indices) {
  indices->clear();
  if (k == 0) return;
  std::vector<size_t> hist(65536, 0);
  for (size_t i = 0; i < n; ++i) ++hist[(std::bit_cast<uint32_t>(x[i]) & kAbsMask) >> 16];
  size_t above = 0;
  uint32_t hi = 65535;
  for (;; --hi) {
    if (above + hist[hi] >= k) break;
    above += hist[hi];
  }
  std::fill(hist.begin(), hist.end(), 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
    if ((b >> 16) == hi) ++hist[b & 0xffffu];
  }
  uint32_t lo = 65535;
  for (;; --lo) {
    if (above + hist[lo] >= k) break;
    above += hist[lo];
  }
  const uint32_t threshold = (hi << 16) | lo;
  size_t ties = k - above;  // values equal to the threshold still to keep
  indices->reserve(k);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
    if (b > threshold) {
      indices->push_back(i);
    } else if (b == threshold && ties > 0) {
      indices->push_back(i);
      --ties;
    }
  }
}

Status EncodeTopk(const CodecOptions& opt, std::span<const float> in, std::vector<uint8_t>* out) {
  const size_t n = in.size();
  if (n > UINT32_MAX) {
    return Status::Error("top-k of " + std::to_string(n) + " values: at most 2^32 - 1 per tensor; split the tensor");
  }
  const uint32_t amax = AbsMaxBits(in.data(), n);
  if (amax >= kInfBits) return NonFiniteError(in.data(), n, 0);
  const size_t k = TopkCount(opt.topk_fraction, n);
  std::vector<size_t> indices;
  SelectTopk(in.data(), n, k, &indices);

  const size_t bitmap_bytes = (n + 7) / 8;
  size_t delta_bytes = 0;
  for (size_t j = 0; j < k; ++j) delta_bytes += VarintBytes(indices[j] - (j == 0 ? 0 : indices[j - 1] + 1));
  const bool delta = delta_bytes < bitmap_bytes;
  const size_t index_bytes = delta ? delta_bytes : bitmap_bytes;  // <= bitmap_bytes < 2^29
  const size_t value_bytes = EncodedBytes(opt.kind, k, opt.block_size);
  out->assign(kTopkHeaderBytes + index_bytes + value_bytes, 0);

  uint8_t* p = out->data();
  p[0] = delta ? kIndexDelta : kIndexBitmap;
  p[1] = static_cast<uint8_t>(opt.kind);
  Store<uint32_t>(p + 4, static_cast<uint32_t>(index_bytes));
  Store<uint32_t>(p + 8, static_cast<uint32_t>(k));
  Store<uint32_t>(p + 12, static_cast<uint32_t>(n));
  uint8_t* index = p + kTopkHeaderBytes;
  if (delta) {
    uint8_t* q = index;
    for (size_t j = 0; j < k; ++j) q = PutVarint(q, indices[j] - (j == 0 ? 0 : indices[j - 1] + 1));
  } else {
    for (size_t i : indices) index[i / 8] = static_cast<uint8_t>(index[i / 8] | (1u << (i % 8)));
  }
  std::vector<float> values(k);
  for (size_t j = 0; j < k; ++j) values[j] = in[indices[j]];
  return EncodeDense(opt.kind, opt.block_size, values,
                     std::span<uint8_t>(out->data() + kTopkHeaderBytes + index_bytes, value_bytes));
}

Status TopkError(const std::string& what) {
  return Status::Error("top-k payload: " + what + "; the sender's encoder or the link corrupted it (drop the message)");
}

Status DecodeTopk(const CodecOptions& opt, std::span<const uint8_t> in, std::span<float> out) {
  const size_t n = out.size();
  if (in.size() < kTopkHeaderBytes) {
    return TopkError(std::to_string(in.size()) + " bytes is shorter than the " + std::to_string(kTopkHeaderBytes) +
                     "-byte header");
  }
  const uint8_t* p = in.data();
  const uint8_t format = p[0];
  const uint32_t index_bytes = Load<uint32_t>(p + 4);
  const size_t k = Load<uint32_t>(p + 8);
  const size_t numel = Load<uint32_t>(p + 12);
  if (format != kIndexBitmap && format != kIndexDelta)
    return TopkError("unknown index format " + std::to_string(format));
  if (p[1] != static_cast<uint8_t>(opt.kind)) {
    return TopkError("values are codec " + std::to_string(p[1]) + ", expected " + KindName(opt.kind));
  }
  if (p[2] != 0 || p[3] != 0) return TopkError("reserved header bytes are not zero");
  if (numel != n) return TopkError("holds " + std::to_string(numel) + " values, expected " + std::to_string(n));
  if (k > n) return TopkError("keeps " + std::to_string(k) + " of " + std::to_string(n) + " values");
  if (format == kIndexBitmap && index_bytes != (n + 7) / 8) {
    return TopkError("bitmap of " + std::to_string(index_bytes) + " bytes for " + std::to_string(n) + " values");
  }
  const size_t value_bytes = EncodedBytes(opt.kind, k, opt.block_size);
  if (index_bytes > in.size() - kTopkHeaderBytes || in.size() - kTopkHeaderBytes - index_bytes != value_bytes) {
    return TopkError(std::to_string(in.size()) + " bytes, but the header says " +
                     std::to_string(kTopkHeaderBytes + size_t{index_bytes} + value_bytes));
  }
  std::vector<float> values(k);
  DL_RETURN_IF_ERROR(DecodeDense(opt.kind, opt.block_size, in.subspan(kTopkHeaderBytes + index_bytes), values)
                         .WithContext("top-k values"));
  std::fill(out.begin(), out.end(), 0.0f);
  const uint8_t* index = p + kTopkHeaderBytes;
  size_t count = 0;
  if (format == kIndexBitmap) {
    if (n % 8 != 0 && (index[index_bytes - 1] >> (n % 8)) != 0) return TopkError("bitmap bits set past the end");
    for (size_t byte = 0; byte < index_bytes; ++byte) {
      unsigned bits = index[byte];
      while (bits != 0) {
        if (count == k) return TopkError("bitmap has more than k = " + std::to_string(k) + " bits set");
        const int bit = std::countr_zero(bits);
        bits &= bits - 1;
        out[byte * 8 + bit] = values[count++];
      }
    }
  } else {
    size_t pos = 0;
    size_t next = 0;  // the smallest index the next gap may reach
    while (pos < index_bytes) {
      uint64_t gap = 0;
      int shift = 0;
      for (;;) {
        if (pos == index_bytes || shift > 63) return TopkError("truncated or overlong varint in the index");
        const uint8_t byte = index[pos++];
        if (shift == 63 && byte > 1) return TopkError("varint in the index overflows 64 bits");
        gap |= static_cast<uint64_t>(byte & 0x7f) << shift;
        shift += 7;
        if ((byte & 0x80) == 0) break;
      }
      if (count == k) return TopkError("index has more than k = " + std::to_string(k) + " entries");
      if (gap >= n - next) return TopkError("index past the end of " + std::to_string(n) + " values");
      const size_t i = next + gap;
      out[i] = values[count++];
      next = i + 1;
    }
  }
  if (count != k) return TopkError("index has " + std::to_string(count) + " entries, header says " + std::to_string(k));
  return Status::Ok();
}

}  // namespace

Status ValidateCodecOptions(const CodecOptions& opt) {
  if (!IsValidCodecKind(static_cast<uint8_t>(opt.kind))) {
    return Status::Error("unknown codec " + std::to_string(static_cast<int>(opt.kind)) +
                         ": use fp32, bf16, int8 or int4");
  }
  DL_RETURN_IF_ERROR(CheckBlockSize(opt.block_size));
  if (!(opt.topk_fraction == 0 || (opt.topk_fraction > 0 && opt.topk_fraction < 1))) {
    return Status::Error("top-k fraction " + std::to_string(opt.topk_fraction) +
                         " is invalid: use 0 (dense) or a value in (0, 1), e.g. 0.1");
  }
  return Status::Ok();
}

size_t TopkCount(double fraction, size_t numel) {
  if (numel == 0) return 0;
  const double k = std::round(fraction * static_cast<double>(numel));
  if (!(k >= 1)) return 1;
  if (k >= static_cast<double>(numel)) return numel;
  return static_cast<size_t>(k);
}

size_t MaxEncodedBytes(const CodecOptions& opt, size_t numel) {
  if (opt.topk_fraction == 0) return EncodedBytes(opt.kind, numel, opt.block_size);
  return kTopkHeaderBytes + (numel + 7) / 8 +
         EncodedBytes(opt.kind, TopkCount(opt.topk_fraction, numel), opt.block_size);
}

Status EncodeDense(CodecKind kind, int block_size, std::span<const float> in, std::span<uint8_t> out) {
  if (!IsValidCodecKind(static_cast<uint8_t>(kind)))
    return Status::Error("unknown codec " + std::to_string(static_cast<int>(kind)));
  if (CodecUsesBlocks(kind)) DL_RETURN_IF_ERROR(CheckBlockSize(block_size));
  const size_t n = in.size();
  const size_t want = EncodedBytes(kind, n, block_size);
  if (LayoutBytes(kind, n, block_size) != want) {
    return Status::Error("internal: " + KindName(kind) + " layout is " +
                         std::to_string(LayoutBytes(kind, n, block_size)) + " bytes but EncodedBytes says " +
                         std::to_string(want) + "; codec.cpp and codec_kind.h disagree");
  }
  if (out.size() != want) {
    return Status::Error(KindName(kind) + " of " + std::to_string(n) + " values needs a " + std::to_string(want) +
                         "-byte buffer, got " + std::to_string(out.size()));
  }
  switch (kind) {
    case CodecKind::kFp32:
      if (CopyToPayload(in.data(), n, out.data()) >= kInfBits) {
        return NonFiniteError(in.data(), n, 0);
      }
      return Status::Ok();
    case CodecKind::kBf16:
      if (EncodeBf16(in.data(), n, out.data()) != 0) return Bf16Error(in.data(), n);
      return Status::Ok();
    case CodecKind::kInt8:
    case CodecKind::kInt4:
      return EncodeBlocks(kind, block_size, in.data(), n, out.data());
  }
  return Status::Error("unknown codec");
}

Status DecodeDense(CodecKind kind, int block_size, std::span<const uint8_t> in, std::span<float> out) {
  if (!IsValidCodecKind(static_cast<uint8_t>(kind)))
    return Status::Error("unknown codec " + std::to_string(static_cast<int>(kind)));
  if (CodecUsesBlocks(kind)) DL_RETURN_IF_ERROR(CheckBlockSize(block_size));
  const size_t n = out.size();
  const size_t want = EncodedBytes(kind, n, block_size);
  if (LayoutBytes(kind, n, block_size) != want) {
    return Status::Error("internal: " + KindName(kind) + " layout disagrees with EncodedBytes");
  }
  if (in.size() != want) {
    return Status::Error(KindName(kind) + " payload is " + std::to_string(in.size()) + " bytes, " + std::to_string(n) +
                         " values need " + std::to_string(want) +
                         "; the message's shape and payload disagree (drop it)");
  }
  switch (kind) {
    case CodecKind::kFp32:
      if (CopyFromPayload(in.data(), n, out.data()) >= kInfBits) {
        for (size_t i = 0; i < n; ++i)
          if (!std::isfinite(out[i])) return PayloadError("NaN/Inf", kind, i);
      }
      return Status::Ok();
    case CodecKind::kBf16:
      if (DecodeBf16(in.data(), n, out.data()) >= 0x7f80u) {
        for (size_t i = 0; i < n; ++i)
          if (!std::isfinite(out[i])) return PayloadError("NaN/Inf", kind, i);
      }
      return Status::Ok();
    case CodecKind::kInt8:
    case CodecKind::kInt4:
      return DecodeBlocks(kind, block_size, in.data(), n, out.data());
  }
  return Status::Error("unknown codec");
}

Status Encode(const CodecOptions& opt, std::span<const float> in, std::vector<uint8_t>* out) {
  DL_RETURN_IF_ERROR(ValidateCodecOptions(opt));
  Status st;
  if (opt.topk_fraction == 0) {
    out->resize(EncodedBytes(opt.kind, in.size(), opt.block_size));
    st = EncodeDense(opt.kind, opt.block_size, in, *out);
  } else {
    st = EncodeTopk(opt, in, out);
  }
  if (!st.ok()) out->clear();
  return st;
}

Status Decode(const CodecOptions& opt, std::span<const uint8_t> in, std::span<float> out) {
  DL_RETURN_IF_ERROR(ValidateCodecOptions(opt));
  if (opt.topk_fraction == 0) return DecodeDense(opt.kind, opt.block_size, in, out);
  return DecodeTopk(opt, in, out);
}

Status EncodeTensors(const CodecOptions& opt, std::span<const float> in, std::span<const uint64_t> numels,
                     std::vector<uint8_t>* out, std::vector<uint64_t>* tensor_bytes) {
  out->clear();
  tensor_bytes->clear();
  DL_RETURN_IF_ERROR(ValidateCodecOptions(opt));
  uint64_t total = 0;
  for (uint64_t numel : numels) total += numel;
  if (total != in.size()) {
    return Status::Error("tensor sizes add up to " + std::to_string(total) + " values but the input has " +
                         std::to_string(in.size()));
  }
  Status st;
  size_t offset = 0;
  if (opt.topk_fraction == 0) {
    size_t bytes = 0;
    for (uint64_t numel : numels) bytes += EncodedBytes(opt.kind, numel, opt.block_size);
    out->resize(bytes);
    size_t at = 0;
    for (size_t t = 0; t < numels.size() && st.ok(); ++t) {
      const size_t b = EncodedBytes(opt.kind, numels[t], opt.block_size);
      st = EncodeDense(opt.kind, opt.block_size, in.subspan(offset, numels[t]), std::span(out->data() + at, b));
      if (!st.ok()) st = st.WithContext("tensor " + std::to_string(t));
      tensor_bytes->push_back(b);
      offset += numels[t];
      at += b;
    }
  } else {
    std::vector<uint8_t> part;
    for (size_t t = 0; t < numels.size() && st.ok(); ++t) {
      st = EncodeTopk(opt, in.subspan(offset, numels[t]), &part);
      if (!st.ok()) st = st.WithContext("tensor " + std::to_string(t));
      out->insert(out->end(), part.begin(), part.end());
      tensor_bytes->push_back(part.size());
      offset += numels[t];
    }
  }
  if (!st.ok()) {
    out->clear();
    tensor_bytes->clear();
  }
  return st;
}

Status DecodeTensors(const CodecOptions& opt, std::span<const uint8_t> in, std::span<const uint64_t> numels,
                     std::span<const uint64_t> tensor_bytes, std::span<float> out) {
  DL_RETURN_IF_ERROR(ValidateCodecOptions(opt));
  if (numels.size() != tensor_bytes.size()) {
    return Status::Error(std::to_string(numels.size()) + " tensor sizes but " + std::to_string(tensor_bytes.size()) +
                         " encoded sizes");
  }
  size_t offset = 0, at = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    if (numels[t] > out.size() - offset || tensor_bytes[t] > in.size() - at) {
      return Status::Error("tensor " + std::to_string(t) + " runs past the end of the payload or the output");
    }
    DL_RETURN_IF_ERROR(Decode(opt, in.subspan(at, tensor_bytes[t]), out.subspan(offset, numels[t]))
                           .WithContext("tensor " + std::to_string(t)));
    offset += numels[t];
    at += tensor_bytes[t];
  }
  if (offset != out.size() || at != in.size()) {
    return Status::Error("tensors cover " + std::to_string(offset) + " values in " + std::to_string(at) +
                         " bytes, but the output has " + std::to_string(out.size()) + " values and the payload " +
                         std::to_string(in.size()) + " bytes");
  }
  return Status::Ok();
}

Status DecodeTensors(const CodecOptions& opt, std::span<const std::span<const uint8_t>> chunks,
                     std::span<const uint64_t> numels, std::span<const uint64_t> tensor_bytes, std::span<float> out) {
  if (chunks.size() == 1) return DecodeTensors(opt, chunks[0], numels, tensor_bytes, out);
  DL_RETURN_IF_ERROR(ValidateCodecOptions(opt));
  if (numels.size() != tensor_bytes.size()) {
    return Status::Error(std::to_string(numels.size()) + " tensor sizes but " + std::to_string(tensor_bytes.size()) +
                         " encoded sizes");
  }
  uint64_t in_bytes = 0;
  for (const auto& c : chunks) in_bytes += c.size();
  std::vector<uint8_t> scratch;
  size_t offset = 0, chunk = 0;
  uint64_t at = 0, chunk_begin = 0;  // payload positions: the tensor's, the current chunk's
  for (size_t t = 0; t < numels.size(); ++t) {
    if (numels[t] > out.size() - offset || tensor_bytes[t] > in_bytes - at) {
      return Status::Error("tensor " + std::to_string(t) + " runs past the end of the payload or the output");
    }
    while (chunk < chunks.size() && at >= chunk_begin + chunks[chunk].size() && tensor_bytes[t] > 0) {
      chunk_begin += chunks[chunk++].size();
    }
    std::span<const uint8_t> in;
    if (tensor_bytes[t] == 0) {
      in = {};
    } else if (at + tensor_bytes[t] <= chunk_begin + chunks[chunk].size()) {
      in = chunks[chunk].subspan(at - chunk_begin, tensor_bytes[t]);  // inside one chunk: no copy
    } else {
      // Across chunks: gather this tensor's bytes.
      scratch.resize(tensor_bytes[t]);
      uint64_t got = 0, pos = at - chunk_begin;
      for (size_t c = chunk; got < scratch.size(); ++c, pos = 0) {
        const uint64_t take = std::min<uint64_t>(chunks[c].size() - pos, scratch.size() - got);
        std::memcpy(scratch.data() + got, chunks[c].data() + pos, take);
        got += take;
      }
      in = scratch;
    }
    DL_RETURN_IF_ERROR(Decode(opt, in, out.subspan(offset, numels[t])).WithContext("tensor " + std::to_string(t)));
    offset += numels[t];
    at += tensor_bytes[t];
  }
  if (offset != out.size() || at != in_bytes) {
    return Status::Error("tensors cover " + std::to_string(offset) + " values in " + std::to_string(at) +
                         " bytes, but the output has " + std::to_string(out.size()) + " values and the payload " +
                         std::to_string(in_bytes) + " bytes");
  }
  return Status::Ok();
}

Status ErrorFeedback::Encode(uint32_t fragment, std::span<const float> delta, std::vector<uint8_t>* payload) {
  const uint64_t n = delta.size();
  return Encode(fragment, delta, std::span(&n, 1), payload, &one_tensor_bytes_);
}

Status ErrorFeedback::Encode(uint32_t fragment, std::span<const float> delta, std::span<const uint64_t> numels,
                             std::vector<uint8_t>* payload, std::vector<uint64_t>* tensor_bytes) {
  const size_t n = delta.size();
  const std::string context = "fragment " + std::to_string(fragment);
  auto it = residual_.find(fragment);
  if (it != residual_.end() && it->second.size() != n) {
    return Status::Error(context + " had " + std::to_string(it->second.size()) + " values, now " + std::to_string(n) +
                         "; Reset(fragment) when its layout changes");
  }
  sum_.resize(n);
  if (it != residual_.end()) {
    const float* __restrict r = it->second.data();
    float* __restrict s = sum_.data();
    for (size_t i = 0; i < n; ++i) s[i] = r[i] + delta[i];
  } else {
    std::copy(delta.begin(), delta.end(), sum_.begin());
  }
  DL_RETURN_IF_ERROR(EncodeTensors(opt_, sum_, numels, payload, tensor_bytes).WithContext(context));
  decoded_.resize(n);
  DL_RETURN_IF_ERROR(DecodeTensors(opt_, *payload, numels, *tensor_bytes, decoded_).WithContext(context));
  std::vector<float>& r = residual_[fragment];
  r.resize(n);
  float* __restrict rp = r.data();
  const float* __restrict s = sum_.data();
  const float* __restrict d = decoded_.data();
  for (size_t i = 0; i < n; ++i) rp[i] = s[i] - d[i];
  return Status::Ok();
}

std::span<const float> ErrorFeedback::residual(uint32_t fragment) const {
  auto it = residual_.find(fragment);
  if (it == residual_.end()) return {};
  return it->second;
}

}  // namespace diloco
