#include "daemon/util/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DILOCO_CRC32C_X86 1
#endif

namespace diloco {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// All functions below work on the raw register (the CRC without its final
// inversion): appending bytes is then linear in the register, which is what
// lets the hardware path combine independent streams.

// Slicing-by-8: table[k][b] is the register after byte b followed by k zeros.
struct SoftwareTables {
  uint32_t t[8][256];
  constexpr SoftwareTables() : t{} {
    for (uint32_t b = 0; b < 256; b++) {
      uint32_t r = b;
      for (int i = 0; i < 8; i++) r = (r >> 1) ^ (kPoly & (0u - (r & 1)));
      t[0][b] = r;
    }
    for (int k = 1; k < 8; k++)
      for (int b = 0; b < 256; b++) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
};
constexpr SoftwareTables kSoft;

inline uint64_t load_u64_le(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // x86 and every target we build for are little-endian
  return v;
}

uint32_t software_raw(const uint8_t* p, size_t n, uint32_t r) {
  const auto& t = kSoft.t;
  for (; n >= 8; p += 8, n -= 8) {
    const uint64_t v = load_u64_le(p) ^ r;
    r = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
        t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
  }
  for (; n > 0; p++, n--) r = t[0][(r ^ *p) & 0xFF] ^ (r >> 8);
  return r;
}

#ifdef DILOCO_CRC32C_X86

// The crc32 instruction has a latency of 3 cycles but a throughput of 1, so
// the hardware path runs three streams over adjacent blocks and joins them:
// reg(A B) = shift_|B|(reg(A)) ^ reg_from_zero(B), where shift_len appends len
// zero bytes. shift is linear, so it is 4 table lookups (one per byte of reg).
constexpr size_t kLongBlock = 8192;
constexpr size_t kShortBlock = 256;

struct ShiftTable {
  uint32_t t[4][256];
  explicit ShiftTable(size_t len) {
    uint32_t basis[32];  // image of each register bit
    for (int bit = 0; bit < 32; bit++) {
      uint32_t r = 1u << bit;
      for (size_t i = 0; i < len; i++) r = kSoft.t[0][r & 0xFF] ^ (r >> 8);
      basis[bit] = r;
    }
    for (int k = 0; k < 4; k++)
      for (uint32_t b = 0; b < 256; b++) {
        uint32_t r = 0;
        for (int bit = 0; bit < 8; bit++)
          if (b & (1u << bit)) r ^= basis[8 * k + bit];
        t[k][b] = r;
      }
  }
  uint32_t shift(uint32_t r) const {
    return t[0][r & 0xFF] ^ t[1][(r >> 8) & 0xFF] ^ t[2][(r >> 16) & 0xFF] ^ t[3][r >> 24];
  }
};

const ShiftTable& long_shift() {
  static const ShiftTable table(kLongBlock);
  return table;
}
const ShiftTable& short_shift() {
  static const ShiftTable table(kShortBlock);
  return table;
}

// Three interleaved streams over 3 * block bytes starting at p.
__attribute__((target("sse4.2"))) inline uint64_t hardware_triple(const uint8_t* p, size_t block,
                                                                  uint64_t r0,
                                                                  const ShiftTable& shift) {
  uint64_t r1 = 0, r2 = 0;
  for (const uint8_t* end = p + block; p < end; p += 8) {
    r0 = _mm_crc32_u64(r0, load_u64_le(p));
    r1 = _mm_crc32_u64(r1, load_u64_le(p + block));
    r2 = _mm_crc32_u64(r2, load_u64_le(p + 2 * block));
  }
  r0 = shift.shift((uint32_t)r0) ^ (uint32_t)r1;
  return shift.shift((uint32_t)r0) ^ (uint32_t)r2;
}

__attribute__((target("sse4.2"))) uint32_t hardware_raw(const uint8_t* p, size_t n, uint32_t reg) {
  uint64_t r = reg;
  for (; n > 0 && ((uintptr_t)p & 7) != 0; p++, n--) r = _mm_crc32_u8((uint32_t)r, *p);
  if (n >= 3 * kShortBlock) {
    const ShiftTable& longs = long_shift();
    const ShiftTable& shorts = short_shift();
    for (; n >= 3 * kLongBlock; p += 3 * kLongBlock, n -= 3 * kLongBlock)
      r = hardware_triple(p, kLongBlock, r, longs);
    for (; n >= 3 * kShortBlock; p += 3 * kShortBlock, n -= 3 * kShortBlock)
      r = hardware_triple(p, kShortBlock, r, shorts);
  }
  for (; n >= 8; p += 8, n -= 8) r = _mm_crc32_u64(r, load_u64_le(p));
  for (; n > 0; p++, n--) r = _mm_crc32_u8((uint32_t)r, *p);
  return (uint32_t)r;
}

bool detect_hardware() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

// ---- AVX-512 carry-less multiply folding (VPCLMULQDQ) ----
//
// The crc32 instruction tops out at ~8 bytes per cycle; folding with carry-less multiplies runs
// at memory speed. A 16-byte lane loaded little-endian holds the polynomial bits of x^127..x^0
// (bit i <-> x^(127-i)), its low 64 bits H and high 64 bits L: lane = H*x^64 + L. Moving a lane
// D bits later (to add it to the lane there) multiplies it by x^D mod P:
//   H*x^(64+D) + L*x^D = H*k_hi + L*k_lo (mod P), each product < 96 bits, itself a lane.
// clmul of a 64-bit value (bit i <-> x^(63-i)) by a 32-bit reflected constant (bit j <->
// x^(31-j)) gives bit m <-> x^(94-m), i.e. the lane layout times x^-33, hence the constants
// k_hi = x^(D+31) mod P and k_lo = x^(D-33) mod P. At the end the one lane left is a 16-byte
// message with the same remainder as everything folded, which the crc32 instruction finishes.

// a*b mod P, both in the reflected form (bit 31 <-> x^0).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b >> 1) ^ (kPoly & (0u - (b & 1)));  // b *= x
  }
  return product;
}

// x^n mod P, reflected.
uint32_t XPowModP(uint64_t n) {
  uint32_t result = 1u << 31, square = 1u << 30;  // x^0, x^1
  for (; n != 0; n >>= 1) {
    if (n & 1) result = MultModP(result, square);
    square = MultModP(square, square);
  }
  return result;
}

// The two constants that move a lane by `bits`, as one 128-bit lane {k_hi, k_lo}.
struct FoldConstant {
  uint64_t hi, lo;
  explicit FoldConstant(uint64_t bits) : hi(XPowModP(bits + 31)), lo(XPowModP(bits - 33)) {}
};

struct FoldConstants {
  FoldConstant by256{256 * 8}, by192{192 * 8}, by128{128 * 8}, by64{64 * 8}, by48{48 * 8},
      by32{32 * 8}, by16{16 * 8};
};
const FoldConstants& fold_constants() {
  static const FoldConstants k;
  return k;
}

__attribute__((target("avx512f,vpclmulqdq"))) inline __m512i Broadcast(const FoldConstant& k) {
  return _mm512_broadcast_i32x4(_mm_set_epi64x((long long)k.lo, (long long)k.hi));
}

// acc moved by k's distance, plus data.
__attribute__((target("avx512f,vpclmulqdq"))) inline __m512i Fold512(__m512i acc, __m512i k,
                                                                      __m512i data) {
  const __m512i a = _mm512_clmulepi64_epi128(acc, k, 0x00);
  const __m512i b = _mm512_clmulepi64_epi128(acc, k, 0x11);
  return _mm512_ternarylogic_epi64(a, b, data, 0x96);  // a ^ b ^ data
}

__attribute__((target("sse4.2,pclmul"))) inline __m128i Fold128(__m128i acc, const FoldConstant& k,
                                                                 __m128i data) {
  const __m128i kk = _mm_set_epi64x((long long)k.lo, (long long)k.hi);
  const __m128i a = _mm_clmulepi64_si128(acc, kk, 0x00);
  const __m128i b = _mm_clmulepi64_si128(acc, kk, 0x11);
  return _mm_xor_si128(_mm_xor_si128(a, b), data);
}

// 64 bytes at src + at, also stored at dst + at when kCopy.
template <bool kCopy>
__attribute__((target("avx512f"))) inline __m512i Load64(uint8_t* dst, const uint8_t* src,
                                                          size_t at) {
  const __m512i v = _mm512_loadu_si512(src + at);
  if constexpr (kCopy) _mm512_storeu_si512(dst + at, v);
  return v;
}

// The raw register after the bytes at src (copied to dst when kCopy), from register reg.
// n >= 256.
template <bool kCopy>
__attribute__((target("avx512f,vpclmulqdq,sse4.2,pclmul"))) uint32_t ClmulRaw(uint8_t* dst,
                                                                            const uint8_t* src,
                                                                            size_t n, uint32_t reg) {
  const FoldConstants& k = fold_constants();
#define load(at) Load64<kCopy>(dst, src, at)
  __m512i x0 = _mm512_xor_si512(load(0), _mm512_castsi128_si512(_mm_cvtsi32_si128((int)reg)));
  __m512i x1 = load(64), x2 = load(128), x3 = load(192);
  size_t at = 256;
  const __m512i k256 = Broadcast(k.by256);
  for (; at + 256 <= n; at += 256) {
    x0 = Fold512(x0, k256, load(at));
    x1 = Fold512(x1, k256, load(at + 64));
    x2 = Fold512(x2, k256, load(at + 128));
    x3 = Fold512(x3, k256, load(at + 192));
  }
  // Four accumulators into one, then whole 64-byte blocks.
  const __m512i k64 = Broadcast(k.by64);
  __m512i x = Fold512(x0, Broadcast(k.by192), Fold512(x1, Broadcast(k.by128), Fold512(x2, k64, x3)));
  for (; at + 64 <= n; at += 64) x = Fold512(x, k64, load(at));
  // Four lanes into one, then whole 16-byte blocks.
  __m128i lane = _mm512_extracti32x4_epi32(x, 3);
  lane = Fold128(_mm512_extracti32x4_epi32(x, 2), k.by16, lane);
  lane = Fold128(_mm512_extracti32x4_epi32(x, 1), k.by32, lane);
  lane = Fold128(_mm512_extracti32x4_epi32(x, 0), k.by48, lane);
  for (; at + 16 <= n; at += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at));
    if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + at), v);
    lane = Fold128(lane, k.by16, v);
  }
  uint64_t r = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(lane));
  r = _mm_crc32_u64(r, (uint64_t)_mm_extract_epi64(lane, 1));
  if constexpr (kCopy) std::memcpy(dst + at, src + at, n - at);
  for (; at < n; at++) r = _mm_crc32_u8((uint32_t)r, src[at]);
  return (uint32_t)r;
#undef load
}

bool detect_clmul() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
         __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
}

#endif  // DILOCO_CRC32C_X86

}  // namespace

namespace crc32c_detail {

uint32_t software(const void* data, size_t n, uint32_t crc) {
  return ~software_raw(static_cast<const uint8_t*>(data), n, ~crc);
}

bool hardware_available() {
#ifdef DILOCO_CRC32C_X86
  static const bool available = detect_hardware();
  return available;
#else
  return false;
#endif
}

uint32_t hardware(const void* data, size_t n, uint32_t crc) {
#ifdef DILOCO_CRC32C_X86
  return ~hardware_raw(static_cast<const uint8_t*>(data), n, ~crc);
#else
  return software(data, n, crc);
#endif
}

bool clmul_available() {
#ifdef DILOCO_CRC32C_X86
  static const bool available = detect_clmul();
  return available;
#else
  return false;
#endif
}

uint32_t clmul(const void* data, size_t n, uint32_t crc) {
#ifdef DILOCO_CRC32C_X86
  if (n < kMinClmulBytes) return hardware(data, n, crc);
  return ~ClmulRaw<false>(nullptr, static_cast<const uint8_t*>(data), n, ~crc);
#else
  return software(data, n, crc);
#endif
}

}  // namespace crc32c_detail

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  if (n >= crc32c_detail::kMinClmulBytes && crc32c_detail::clmul_available()) {
    return crc32c_detail::clmul(data, n, crc);
  }
  if (crc32c_detail::hardware_available()) return crc32c_detail::hardware(data, n, crc);
  return crc32c_detail::software(data, n, crc);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // Appending len_b bytes multiplies a's remainder by x^(8 len_b); the pre/post inversions of
  // both CRCs cancel out (as in zlib).
  return MultModP(XPowModP(8 * len_b), crc_a) ^ crc_b;
}

void Crc32cJoiner::Add(uint32_t crc, uint64_t len) {
  if (empty_) {
    crc_ = crc;
    empty_ = false;
    return;
  }
  if (len != shift_len_) {
    shift_len_ = len;
    shift_ = XPowModP(8 * len);
  }
  crc_ = MultModP(shift_, crc_) ^ crc;
}

uint32_t Crc32cCopy(void* dst, const void* src, size_t n, uint32_t crc) {
#ifdef DILOCO_CRC32C_X86
  if (n >= crc32c_detail::kMinClmulBytes && crc32c_detail::clmul_available()) {
    return ~ClmulRaw<true>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, ~crc);
  }
#endif
  // Copy then CRC the copy while it is still in cache, in L2-sized pieces.
  constexpr size_t kPiece = 256 << 10;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t len = n - at < kPiece ? n - at : kPiece;
    std::memcpy(d + at, s + at, len);
    crc = Crc32c(d + at, len, crc);
  }
  return crc;
}

}  // namespace diloco
