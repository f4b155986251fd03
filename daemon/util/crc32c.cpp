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

}  // namespace crc32c_detail

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  if (crc32c_detail::hardware_available()) return crc32c_detail::hardware(data, n, crc);
  return crc32c_detail::software(data, n, crc);
}

}  // namespace diloco
