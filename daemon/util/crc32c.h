// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI,
// ext4, LevelDB and our checkpoints and network frames.
// Check value: Crc32c("123456789", 9) == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace diloco {

// CRC of data[0..n), continuing from crc (the CRC of the bytes before):
// Crc32c(b, nb, Crc32c(a, na)) is the CRC of a followed by b. Uses the SSE4.2
// crc32 instruction when the CPU has it (~20 GB/s), else tables (~1-2 GB/s).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// The two paths, for tests and benchmarks; Crc32c picks one at run time.
namespace crc32c_detail {
uint32_t software(const void* data, size_t n, uint32_t crc);
bool hardware_available();
// Only call when hardware_available().
uint32_t hardware(const void* data, size_t n, uint32_t crc);
}  // namespace crc32c_detail

}  // namespace diloco
