#include "daemon/util/crc32c.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/rng.h"

namespace diloco {
namespace {

using crc32c_detail::hardware;
using crc32c_detail::hardware_available;
using crc32c_detail::software;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = (uint8_t)rng.next_u64();
  return out;
}

// Bit-at-a-time reference, straight from the definition.
uint32_t reference_crc(const uint8_t* p, size_t n) {
  uint32_t r = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    r ^= p[i];
    for (int k = 0; k < 8; k++) r = (r >> 1) ^ (0x82F63B78u & (0u - (r & 1)));
  }
  return ~r;
}

TEST_CASE("crc32c matches the standard check values", "[unit][util]") {
  const char* check = "123456789";
  CHECK(Crc32c(check, 9) == 0xE3069283u);
  CHECK(software(check, 9, 0) == 0xE3069283u);
  CHECK(Crc32c("", 0) == 0u);
  // RFC 3720 B.4: 32 bytes of zeros, of 0xFF.
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  CHECK(Crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(Crc32c(ones.data(), 32) == 0x62A8AB43u);
  if (hardware_available()) {
    CHECK(hardware(check, 9, 0) == 0xE3069283u);
    CHECK(hardware(zeros.data(), 32, 0) == 0x8A9136AAu);
  } else {
    WARN("no SSE4.2: the hardware path is not tested");
  }
}

TEST_CASE("crc32c hardware and software agree on random lengths and alignments", "[unit][util]") {
  // Long enough to reach the 3 x 8 KiB and 3 x 256 B interleaved blocks.
  const std::vector<uint8_t> buf = random_bytes(80000, 1);
  Rng rng(2);
  for (int trial = 0; trial < 300; trial++) {
    const size_t offset = rng.below(16);
    const size_t max_len = trial < 150 ? 1000 : buf.size() - 16;
    const size_t n = rng.below(max_len + 1);
    const uint8_t* p = buf.data() + offset;
    const uint32_t sw = software(p, n, 0);
    INFO("offset " << offset << " length " << n);
    if (n <= 4096) REQUIRE(sw == reference_crc(p, n));
    if (hardware_available()) REQUIRE(hardware(p, n, 0) == sw);
    REQUIRE(Crc32c(p, n) == sw);
  }
  // Exactly at the block boundaries.
  for (size_t n : {767, 768, 769, 24575, 24576, 24577, 24576 + 768, 3 * 24576}) {
    INFO("length " << n);
    const uint32_t sw = software(buf.data(), n, 0);
    REQUIRE(sw == reference_crc(buf.data(), n));
    if (hardware_available()) REQUIRE(hardware(buf.data(), n, 0) == sw);
  }
}

TEST_CASE("crc32c is incremental", "[unit][util]") {
  const std::vector<uint8_t> buf = random_bytes(60000, 3);
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  Rng rng(4);
  for (int trial = 0; trial < 50; trial++) {
    const size_t cut = rng.below(buf.size() + 1);
    const uint8_t* p = buf.data();
    INFO("cut at " << cut);
    REQUIRE(Crc32c(p + cut, buf.size() - cut, Crc32c(p, cut)) == whole);
    REQUIRE(software(p + cut, buf.size() - cut, software(p, cut, 0)) == whole);
    if (hardware_available())
      REQUIRE(hardware(p + cut, buf.size() - cut, hardware(p, cut, 0)) == whole);
  }
  // Three pieces, mixing the two paths.
  const uint32_t a = software(buf.data(), 1000, 0);
  const uint32_t b = Crc32c(buf.data() + 1000, 30000, a);
  CHECK(software(buf.data() + 31000, buf.size() - 31000, b) == whole);
}

TEST_CASE("crc32c joiner: pieces of equal and mixed lengths join into the crc of the whole", "[unit][util]") {
  const std::vector<uint8_t> buf = random_bytes(70000, 7);
  // 16 KiB pieces (the power of x kept from one to the next), a short last one, then mixed.
  for (std::vector<size_t> lengths : {std::vector<size_t>{16384, 16384, 16384, 16384, 4464},
                                      std::vector<size_t>{1, 16384, 3, 3, 53609}, std::vector<size_t>{70000}}) {
    Crc32cJoiner joiner;
    size_t at = 0;
    for (size_t len : lengths) {
      joiner.Add(Crc32c(buf.data() + at, len), len);
      at += len;
    }
    REQUIRE(at == buf.size());
    CHECK(joiner.crc() == Crc32c(buf.data(), buf.size()));
  }
}

TEST_CASE("crc32c of pieces combines into the crc of the whole, in any order", "[unit][util]") {
  const std::vector<uint8_t> buf = random_bytes(70000, 5);
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  Rng rng(6);
  for (int trial = 0; trial < 50; trial++) {
    const size_t cut = rng.below(buf.size() + 1);
    INFO("cut at " << cut);
    const uint32_t a = Crc32c(buf.data(), cut), b = Crc32c(buf.data() + cut, buf.size() - cut);
    REQUIRE(Crc32cCombine(a, b, buf.size() - cut) == whole);
  }
  CHECK(Crc32cCombine(0, Crc32c(buf.data(), 100), 100) == Crc32c(buf.data(), 100));  // empty a
  CHECK(Crc32cCombine(whole, 0, 0) == whole);                                        // empty b
  // A wrong piece length gives a wrong crc.
  const uint32_t a = Crc32c(buf.data(), 1000), b = Crc32c(buf.data() + 1000, buf.size() - 1000);
  CHECK(Crc32cCombine(a, b, buf.size() - 1001) != whole);
}

TEST_CASE("crc32c carry-less folding and copy-with-crc agree with the software path", "[unit][util]") {
  const std::vector<uint8_t> buf = random_bytes(200000, 6);
  Rng rng(7);
  std::vector<uint8_t> dst(buf.size());
  for (int trial = 0; trial < 300; trial++) {
    const size_t offset = rng.below(64);
    // Around the fold's block sizes (16, 64, 256 bytes) and well past them.
    const size_t n = trial < 100 ? rng.below(1200) : rng.below(buf.size() - 64 + 1);
    const uint8_t* p = buf.data() + offset;
    const uint32_t seed = trial % 2 ? 0 : (uint32_t)rng.next_u64();
    const uint32_t sw = software(p, n, seed);
    INFO("offset " << offset << " length " << n << " seed " << seed);
    if (crc32c_detail::clmul_available()) REQUIRE(crc32c_detail::clmul(p, n, seed) == sw);
    std::fill(dst.begin(), dst.end(), 0);
    REQUIRE(Crc32cCopy(dst.data() + 3, p, n, seed) == sw);
    REQUIRE(std::memcmp(dst.data() + 3, p, n) == 0);
    REQUIRE(dst[2] == 0);
    REQUIRE(dst[3 + n] == 0);
  }
  if (!crc32c_detail::clmul_available()) WARN("no AVX-512 VPCLMULQDQ: the folding path is not tested");
}

volatile uint32_t g_sink;

// Not run by default: train_tests "[.bench]". 1 MiB stays in cache; 64 MiB
// is bound by memory bandwidth.
TEST_CASE("crc32c throughput", "[.bench]") {
  for (size_t size : {size_t(1) << 20, size_t(64) << 20}) {
    const std::vector<uint8_t> buf = random_bytes(size, 5);
    auto gbps = [&](uint32_t (*fn)(const void*, size_t, uint32_t)) {
      uint32_t sink = fn(buf.data(), size, 0);  // warm up
      size_t bytes = 0;
      double seconds = 0;
      const auto t0 = std::chrono::steady_clock::now();
      while (seconds < 0.3) {
        sink = fn(buf.data(), size, sink);
        bytes += size;
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      g_sink = sink;  // keeps the work from being optimized away
      return (double)bytes / seconds / 1e9;
    };
    std::printf("crc32c %zu KiB: software %.2f GB/s", size >> 10, gbps(software));
    if (hardware_available()) std::printf(", hardware %.2f GB/s", gbps(hardware));
    std::printf("\n");
  }
}

}  // namespace
}  // namespace diloco
