// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI,
// ext4, LevelDB and our checkpoints and network frames.
// Check value: Crc32c("123456789", 9) == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace diloco {

// CRC of data[0..n), continuing from crc (the CRC of the bytes before):
// Crc32c(b, nb, Crc32c(a, na)) is the CRC of a followed by b. From kMinClmulBytes on it folds
// with AVX-512 carry-less multiplies when the CPU has VPCLMULQDQ (memory speed: ~60 GB/s in
// cache, ~20+ GB/s from DRAM), else uses the SSE4.2 crc32 instruction (~24 GB/s in cache, ~15
// from DRAM), else tables (~1-2 GB/s).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// Copies src[0..n) to dst (not overlapping) and returns Crc32c(src, n, crc), in one pass over
// the bytes where the CPU allows: what a receiver does to reassemble and verify a payload.
uint32_t Crc32cCopy(void* dst, const void* src, size_t n, uint32_t crc = 0);

// The CRC of a followed by b from crc_a = Crc32c(a), crc_b = Crc32c(b) and b's length (as zlib's
// crc32_combine): lets pieces be checked in any order, e.g. the most recently received first,
// while they are still in cache.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Joins CRCs of pieces in order (Crc32cCombine), keeping the power of x of the last length seen:
// joining many pieces of one length costs one multiply each.
class Crc32cJoiner {
 public:
  // The CRC so far, after a piece of len bytes with CRC crc.
  void Add(uint32_t crc, uint64_t len);
  uint32_t crc() const { return crc_; }

 private:
  uint32_t crc_ = 0;
  bool empty_ = true;
  uint64_t shift_len_ = 0;
  uint32_t shift_ = 0;
};

// The two paths, for tests and benchmarks; Crc32c picks one at run time.
namespace crc32c_detail {
uint32_t software(const void* data, size_t n, uint32_t crc);
bool hardware_available();
// Only call when hardware_available().
uint32_t hardware(const void* data, size_t n, uint32_t crc);
// AVX-512 VPCLMULQDQ folding (shorter inputs go to hardware()); only call when clmul_available().
inline constexpr size_t kMinClmulBytes = 256;
bool clmul_available();
uint32_t clmul(const void* data, size_t n, uint32_t crc);
}  // namespace crc32c_detail

}  // namespace diloco
