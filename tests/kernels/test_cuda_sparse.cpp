// The chunked top-k encoder on the device (kernels/cuda/sync_sparse.cu) against the CPU's
// sparse_encode_chunk (kernels/cpu/sync_sparse.cpp): the records must be the same bytes, on
// random tensors of several lengths (a short last chunk, fewer values than one chunk), ties of
// |x| (including +0 / -0), all-zero chunks, values so tiny that w = 0, subnormal values whose
// codes floor to -1, bits 2 / 4 / 8, and chunk / keep pairs from the default (4096 / 64) to
// small ones whose index bits do not fill bytes. Outputs are poisoned (0xff) before each run.
//
// Tagged [cuda]: without a CUDA device every case WARNs and returns (Catch2 v2 has no SKIP).
// Run on a GPU by scripts/gpu-check.sh (every "cuda:" case of cuda_tests). Written and compiled
// on a machine without a GPU: until that script has run on one, nothing here has been observed
// to pass.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"
#include "kernels/sync_sparse.h"
#include "tests/kernels/cuda_testing.h"
#include "tests/kernels/op_testing.h"

namespace diloco {
namespace {

using cuda::DeviceArray;
using testing::random_vec;

uint64_t sparse_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("DILOCO_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("cuda sparse tests: seed %llu (DILOCO_TEST_SEED=%llu repeats it)\n", (unsigned long long)s,
                (unsigned long long)s);
    return s;
  }();
  return seed;
}

// The CPU records of x, chunk after chunk (daemon/net/codec.cpp EncodeChunked without its header).
std::vector<uint8_t> cpu_records(const std::vector<float>& x, size_t chunk, size_t keep, int bits) {
  const size_t n = x.size();
  std::vector<uint8_t> out(sparse_records_bytes(n, chunk, keep, bits));
  std::vector<uint64_t> scratch(2 * chunk);
  uint8_t* p = out.data();
  for (size_t lo = 0; lo < n; lo += chunk) {
    const size_t len = std::min(chunk, n - lo), kc = sparse_keep_of(len, chunk, keep);
    sparse_encode_chunk(p, x.data() + lo, len, kc, chunk, bits, scratch.data());
    p += sparse_record_bytes(kc, chunk, bits);
  }
  REQUIRE(p == out.data() + out.size());
  return out;
}

// The device records of x, and the bad flag.
std::vector<uint8_t> gpu_records(const std::vector<float>& x, size_t chunk, size_t keep, int bits, int* bad_out) {
  const size_t n = x.size();
  DeviceArray<float> dx(x);
  DeviceArray<uint8_t> records(sparse_records_bytes(n, chunk, keep, bits));
  records.fill(0xff);
  DeviceArray<uint32_t> scratch(cuda::sparse_encode_scratch_words(n, chunk, keep));
  DeviceArray<int> bad(1);
  bad.fill(0x7f);
  cuda::sparse_encode(records.get(), scratch.get(), bad.get(), dx.get(), n, chunk, keep, bits, nullptr);
  cuda::synchronize();
  *bad_out = bad.download()[0];
  return records.download();
}

// Index of the first differing byte, or -1.
long first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); i++)
    if (a[i] != b[i]) return (long)i;
  return -1;
}

// Values with the features the encoder must get right, chunk by chunk (kind = chunk index % 8).
std::vector<float> test_values(size_t n, size_t chunk, Rng& rng) {
  std::vector<float> x(n);
  for (size_t lo = 0, c = 0; lo < n; lo += chunk, c++) {
    const size_t len = std::min(chunk, n - lo);
    float* v = x.data() + lo;
    const double scale = std::ldexp(1.0, (int)rng.below(40) - 30);
    switch (c % 8) {
      case 0:  // Gaussian
      case 1:
        for (size_t i = 0; i < len; i++) v[i] = (float)(rng.normal() * scale);
        break;
      case 2:  // ties: a few magnitudes, both signs, +0 and -0
        for (size_t i = 0; i < len; i++) {
          const int k = (int)rng.below(5);
          const float m = k == 0 ? 0.0f : (float)(k * 0.25 * scale);
          v[i] = rng.below(2) ? -m : m;
        }
        break;
      case 3:  // all zero (+0 and -0): w = 0
        for (size_t i = 0; i < len; i++) v[i] = rng.below(2) ? -0.0f : 0.0f;
        break;
      case 4:  // subnormal: w below ~2.9e-39, so 1/w overflows: w = 0, codes L_b/2
        for (size_t i = 0; i < len; i++)
          v[i] = std::bit_cast<float>((uint32_t)(rng.below(1u << 20) | (rng.below(2) << 31)));
        break;
      case 5:  // around the w = 0 edge: |x| ~ 1e-38 (w finite or not, subnormal products)
        for (size_t i = 0; i < len; i++) v[i] = (float)(rng.normal() * 4e-38);
        break;
      case 6:  // Gaussian plus the smallest subnormals of both signs: codes of -tiny floor to -1
        for (size_t i = 0; i < len; i++) {
          v[i] = (float)(rng.normal() * scale);
          if (rng.below(3) == 0) v[i] = std::bit_cast<float>((uint32_t)(1u | (rng.below(2) << 31)));
        }
        break;
      default:  // heavy tail, and one value on a power of two
        for (size_t i = 0; i < len; i++) {
          const double g = rng.normal();
          v[i] = (float)(g * g * g * scale);
        }
        v[rng.below(len)] = (float)scale;
        break;
    }
  }
  return x;
}

}  // namespace

TEST_CASE("cuda: topk_chunked records byte for byte", "[cuda]") {
  REQUIRE_CUDA_DEVICE();
  Rng rng(sparse_seed() * 0x9e3779b97f4a7c15ULL + 31);
  struct Config {
    size_t chunk, keep;
  };
  // The default; a small chunk; index bits that do not fill bytes (ib 7, 10, 1); keep everything;
  // the largest chunk the wire takes.
  const Config configs[] = {{4096, 64}, {64, 3}, {100, 7}, {1000, 33}, {2, 1}, {64, 64}, {65536, 64}};
  for (const Config& cfg : configs) {
    const size_t C = cfg.chunk;
    // One value; less than a chunk; a chunk; a chunk and one; 9 chunks and a short one; random.
    const size_t lengths[] = {1, C / 2 + 1, C - 1, C, C + 1, 9 * C + C / 3 + 1, 1 + rng.below(12 * C)};
    for (size_t n : lengths) {
      if (C == 65536 && n > 4 * C) continue;  // enough for the largest chunk
      for (int bits : {2, 4, 8}) {
        INFO("chunk " << C << " keep " << cfg.keep << " n " << n << " bits " << bits);
        const std::vector<float> x = test_values(n, C, rng);
        const std::vector<uint8_t> want = cpu_records(x, C, cfg.keep, bits);
        int bad = -1;
        const std::vector<uint8_t> got = gpu_records(x, C, cfg.keep, bits, &bad);
        CHECK(bad == 0);
        REQUIRE(got.size() == want.size());
        const long at = first_difference(got, want);
        INFO("first differing byte " << at << " (record size "
                                     << sparse_record_bytes(sparse_keep_of(C, C, cfg.keep), C, bits) << ")");
        CHECK(at == -1);
      }
    }
  }
}

TEST_CASE("cuda: topk_chunked flags NaN and Inf", "[cuda]") {
  REQUIRE_CUDA_DEVICE();
  for (float bad_value : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> x = random_vec<float>(5000, 7);
    x[4100] = bad_value;
    int bad = -1;
    gpu_records(x, 4096, 64, 2, &bad);
    CHECK(bad == 1);
  }
  std::vector<float> x = random_vec<float>(5000, 8);
  int bad = -1;
  gpu_records(x, 4096, 64, 2, &bad);
  CHECK(bad == 0);
}

}  // namespace diloco
