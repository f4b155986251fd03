#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "daemon/net/codec.h"
#include "daemon/util/task_pool.h"

namespace diloco {
namespace {

const CodecKind kAllKinds[] = {CodecKind::kFp32, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kInt4};

std::vector<float> Gaussian(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

double RelL2(std::span<const float> ref, std::span<const float> got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Encode + decode, requiring both to succeed.
std::vector<float> RoundTrip(const CodecOptions& opt, std::span<const float> x,
                             std::vector<uint8_t>* payload = nullptr) {
  std::vector<uint8_t> local;
  std::vector<uint8_t>& p = payload ? *payload : local;
  const Status enc = Encode(opt, x, &p);
  INFO(enc.message());
  REQUIRE(enc.ok());
  std::vector<float> y(x.size(), -1.0f);
  const Status dec = Decode(opt, p, y);
  INFO(dec.message());
  REQUIRE(dec.ok());
  return y;
}

size_t ExpectedDenseBytes(CodecKind kind, size_t n, size_t block) {
  const size_t blocks = (n + block - 1) / block;
  switch (kind) {
    case CodecKind::kFp32:
      return 4 * n;
    case CodecKind::kBf16:
      return 2 * n;
    case CodecKind::kInt8:
      return n + 4 * blocks;
    case CodecKind::kInt4:
      return (n + 1) / 2 + 4 * blocks;
  }
  return 0;
}

float ReadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

TEST_CASE("codec: relative L2 error per message on Gaussian data", "[unit][net]") {
  // 20 messages of an odd length (not a multiple of 2 or of any block size).
  const size_t n = 4099;
  for (int block : {32, 64, 128, 256}) {
    for (CodecKind kind : kAllKinds) {
      const CodecOptions opt{kind, block, 0};
      double worst = 0;
      for (uint64_t msg = 0; msg < 20; ++msg) {
        const std::vector<float> x = Gaussian(n, 100 + msg, 0.01f);
        std::vector<uint8_t> payload;
        const std::vector<float> y = RoundTrip(opt, x, &payload);
        REQUIRE(payload.size() == ExpectedDenseBytes(kind, n, block));
        REQUIRE(payload.size() == EncodedBytes(kind, n, block));
        worst = std::max(worst, RelL2(x, y));
        if (kind == CodecKind::kFp32) REQUIRE(std::memcmp(x.data(), y.data(), 4 * n) == 0);
      }
      INFO("block " << block << " codec " << int(kind) << " worst rel L2 " << worst);
      switch (kind) {
        case CodecKind::kFp32:
          CHECK(worst == 0);
          break;
        case CodecKind::kBf16:
          CHECK(worst <= 0.004);
          break;
        case CodecKind::kInt8:
          CHECK(worst <= 0.01);
          break;
        // The 12% target at every block size (the Lloyd-Max levels: ~8.5% at 32, 9.0% at 64,
        // 9.6% at 128, 10.3% at 256; a uniform grid of +-7 steps had 11.2% / 12.2% / 13.6%).
        case CodecKind::kTopkChunked:  // not in kAllKinds (sparse: its own tests below)
          break;
        case CodecKind::kInt4:
          CHECK(worst <= 0.12);
          break;
      }
    }
  }
}

TEST_CASE("codec: every value on its block's nearest level, odd lengths", "[unit][net]") {
  for (CodecKind kind : {CodecKind::kInt8, CodecKind::kInt4}) {
    for (int block : {2, 32, 64, 128, 256}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{31}, size_t{33}, size_t{63}, size_t{65},
                       size_t{255}, size_t{257}, size_t{1001}}) {
        const std::vector<float> x = Gaussian(n, n * 7 + block);
        std::vector<uint8_t> payload;
        const std::vector<float> y = RoundTrip({kind, block, 0}, x, &payload);
        REQUIRE(payload.size() == ExpectedDenseBytes(kind, n, block));
        for (size_t lo = 0; lo < n; lo += block) {
          const size_t hi = std::min(n, lo + block);
          float amax = 0;
          for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
          const float scale = ReadF32(payload.data() + 4 * (lo / block));
          if (kind == CodecKind::kInt8) {
            REQUIRE(scale == amax / 127.0f);
            for (size_t i = lo; i < hi; ++i) REQUIRE(std::fabs(y[i] - x[i]) <= scale * 0.5f * 1.0001f);
          } else {
            // int4: scale = absmax, which decodes exactly; every value is a level, the nearest.
            REQUIRE(scale == amax);
            for (size_t i = lo; i < hi; ++i) {
              if (std::fabs(x[i]) == amax) REQUIRE(y[i] == x[i]);
              REQUIRE(std::any_of(std::begin(kInt4Levels), std::end(kInt4Levels),
                                  [&](float l) { return l * scale == y[i]; }));
              // (the slack: GCC may fuse l * scale - x into one FMA, without the product's rounding)
              for (float l : kInt4Levels) REQUIRE(std::fabs(y[i] - x[i]) <= std::fabs(l * scale - x[i]) + 1e-6f * scale);
            }
          }
        }
        if (kind == CodecKind::kInt4 && n % 2 == 1) REQUIRE((payload.back() >> 4) == 0);  // pad nibble
      }
    }
  }
}

TEST_CASE("codec: int8/int4 codes, rounding and packing by hand", "[unit][net]") {
  // int4, one block of 8, absmax 1 -> scale 1; the nearest level; low nibble first.
  const std::vector<float> x = {1, -1, 0, 0.09f, 0.1f, -0.3f, 0.76f, 0.5f};
  std::vector<uint8_t> p;
  const std::vector<float> y = RoundTrip({CodecKind::kInt4, 8, 0}, x, &p);
  REQUIRE(p.size() == 4 + 4);
  CHECK(ReadF32(p.data()) == 1.0f);
  CHECK(p[4] == 0x0f);  // 1 -> 15 (+1) low, -1 -> 0 (-1) high
  CHECK(p[5] == 0x88);  // 0 and 0.09 -> 8 (+0.047: below the midpoint 0.0945)
  CHECK(p[6] == 0x49);  // 0.1 -> 9 (+0.142), -0.3 -> 4 (-0.345)
  CHECK(p[7] == 0xce);  // 0.76 -> 14 (+0.757), 0.5 -> 12 (+0.460)
  CHECK(y == std::vector<float>{1, -1, kInt4Levels[8], kInt4Levels[8], kInt4Levels[9], kInt4Levels[4],
                                kInt4Levels[14], kInt4Levels[12]});
  for (int c = 0; c < 16; ++c) CHECK(kInt4Levels[15 - c] == -kInt4Levels[c]);

  // int8, absmax 127 -> scale 1.
  const std::vector<float> z = {127, -127, 0.5f, 1.5f, -0.5f, -1.5f};
  const std::vector<float> w = RoundTrip({CodecKind::kInt8, 64, 0}, z, &p);
  REQUIRE(p.size() == 4 + 6);
  CHECK(ReadF32(p.data()) == 1.0f);
  CHECK(std::vector<uint8_t>(p.begin() + 4, p.end()) == std::vector<uint8_t>{127, 0x81, 0, 2, 0, 0xfe});
  CHECK(w == std::vector<float>{127, -127, 0, 2, -0.0f, -2});

  // The code rounds the EXACT product x * 127/absmax (kernels/sync_ops.h), never a rounded one:
  // absmax 381, 127/381 rounds to 1/3 + 9.9e-9, and 7.5 * that is 2.50000007 -> 3 (a build
  // that rounded the product to 2.5 first would write 2). Every site writes these bytes.
  const std::vector<float> near_tie = {381.0f, 7.5f, -7.5f, 4.5f};
  CHECK(RoundTrip({CodecKind::kInt8, 64, 0}, near_tie, &p) == std::vector<float>{381, 9, -9, 6});
  CHECK(p == std::vector<uint8_t>{0x00, 0x00, 0x40, 0x40, 127, 3, 0xfd, 2});
}

TEST_CASE("codec: zero and tiny blocks decode to zeros", "[unit][net]") {
  for (CodecKind kind : {CodecKind::kInt8, CodecKind::kInt4}) {
    std::vector<float> x = Gaussian(3 * 64, 5);
    std::fill(x.begin(), x.begin() + 64, 0.0f);          // block 0: zero
    std::fill(x.begin() + 64, x.begin() + 128, 1e-38f);  // block 1: below 127/FLT_MAX
    std::vector<uint8_t> p;
    const std::vector<float> y = RoundTrip({kind, 64, 0}, x, &p);
    CHECK(ReadF32(p.data()) == 0.0f);
    CHECK(ReadF32(p.data() + 4) == 0.0f);
    for (size_t i = 0; i < 128; ++i) REQUIRE(y[i] == 0.0f);
    CHECK(RelL2(std::span(x).subspan(128), std::span(y).subspan(128)) < 0.2);
  }
  // Huge but finite values: the scale stays small enough that decoding gives finite numbers.
  std::vector<float> big(64, std::numeric_limits<float>::max());
  big[1] = -big[1];
  for (CodecKind kind : {CodecKind::kInt8, CodecKind::kInt4}) {
    const std::vector<float> y = RoundTrip({kind, 64, 0}, big);
    for (float v : y) REQUIRE(std::isfinite(v));
    CHECK(RelL2(big, y) < 1e-6);
  }
}

TEST_CASE("codec: bf16 rounds to nearest even", "[unit][net]") {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80},  // 1.0
      {0x3f808000, 0x3f80},  // tie, even below
      {0x3f818000, 0x3f82},  // tie, odd below -> up
      {0x3f808001, 0x3f81},  // just above the tie
      {0x3f807fff, 0x3f80},  // just below the tie
      {0xbf818000, 0xbf82},  // negative tie, odd -> away from zero
      {0xbf808000, 0xbf80},  // negative tie, even
      {0x3f80ffff, 0x3f81},  // carries into the next mantissa
      {0x3fffffff, 0x4000},  // carries into the exponent
      {0x7f7f7fff, 0x7f7f},  // largest bf16 stays finite
      {0x00018000, 0x0002},  // subnormal tie, odd -> up
      {0x80000000, 0x8000},  // -0
  };
  std::vector<float> x;
  for (const Case& c : cases) x.push_back(std::bit_cast<float>(c.in));
  std::vector<uint8_t> p;
  const std::vector<float> y = RoundTrip({CodecKind::kBf16, 64, 0}, x, &p);
  REQUIRE(p.size() == 2 * x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t got = uint16_t(p[2 * i] | p[2 * i + 1] << 8);
    INFO("case " << i << " in 0x" << std::hex << cases[i].in);
    CHECK(got == cases[i].out);
    CHECK(std::bit_cast<uint32_t>(y[i]) == uint32_t(cases[i].out) << 16);
  }
  // FLT_MAX rounds up to Inf in bf16: an error naming the index, not Inf on the wire.
  const std::vector<float> overflow = {1.0f, std::numeric_limits<float>::max()};
  const Status st = Encode({CodecKind::kBf16, 64, 0}, overflow, &p);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("index 1") && Catch::Contains("overflows bf16"));
}

TEST_CASE("codec: NaN/Inf input is an error naming the index", "[unit][net]") {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (CodecKind kind : kAllKinds) {
    for (double topk : {0.0, 0.1}) {
      for (float bad : bad_values) {
        for (size_t at : {size_t{0}, size_t{1234}, size_t{2999}}) {
          std::vector<float> x = Gaussian(3000, 9);
          x[at] = bad;
          std::vector<uint8_t> p = {1, 2, 3};
          const Status st = Encode({kind, 64, topk}, x, &p);
          INFO("codec " << int(kind) << " topk " << topk << " at " << at);
          REQUIRE_FALSE(st.ok());
          CHECK_THAT(st.message(), Catch::Contains("index " + std::to_string(at) + " is"));
          CHECK(p.empty());
        }
      }
    }
  }
}

TEST_CASE("codec: wrong-size payloads and buffers are rejected", "[unit][net]") {
  const std::vector<float> x = Gaussian(1000, 3);
  for (CodecKind kind : kAllKinds) {
    for (double topk : {0.0, 0.1, 0.5}) {
      const CodecOptions opt{kind, 64, topk};
      std::vector<uint8_t> p;
      REQUIRE(Encode(opt, x, &p).ok());
      std::vector<float> y(x.size());
      for (long delta : {-1L, 1L, -long(p.size())}) {
        std::vector<uint8_t> q = p;
        q.resize(p.size() + delta);
        INFO("codec " << int(kind) << " topk " << topk << " size change " << delta);
        CHECK_FALSE(Decode(opt, q, y).ok());
      }
      // The right payload for another number of values.
      std::vector<float> y2(x.size() + 1);
      CHECK_FALSE(Decode(opt, p, y2).ok());
    }
    // Dense: caller buffers of the wrong size.
    std::vector<uint8_t> out(EncodedBytes(kind, x.size(), 64) + 1);
    CHECK_FALSE(EncodeDense(kind, 64, x, out).ok());
  }
  std::vector<uint8_t> p;
  CHECK_FALSE(Encode({CodecKind::kInt8, 63, 0}, x, &p).ok());
  CHECK_FALSE(Encode({CodecKind::kInt8, 0, 0}, x, &p).ok());
  CHECK_FALSE(Encode({CodecKind::kInt8, 64, 1.0}, x, &p).ok());
  CHECK_FALSE(Encode({static_cast<CodecKind>(0), 64, 0}, x, &p).ok());
}

TEST_CASE("codec: corrupted payloads are rejected, never decoded to garbage", "[unit][net]") {
  const std::vector<float> x = Gaussian(257, 4);
  std::vector<float> y(x.size());
  auto corrupt = [&](CodecKind kind, size_t at, uint8_t value) {
    std::vector<uint8_t> p;
    REQUIRE(Encode({kind, 64, 0}, x, &p).ok());
    p.at(at) = value;
    return Decode({kind, 64, 0}, p, y);
  };
  const size_t scales = 4 * 5;  // 257 values, block 64: 5 scales
  CHECK_THAT(corrupt(CodecKind::kInt8, scales + 10, 0x80).message(), Catch::Contains("code -128 at index 10"));
  // Every int4 code is a level; 0x88 decodes.
  CHECK(corrupt(CodecKind::kInt4, scales + 10, 0x88).ok());
  CHECK_THAT(corrupt(CodecKind::kInt4, scales + 128, 0x10).message(), Catch::Contains("pad nibble"));
  CHECK_THAT(corrupt(CodecKind::kInt8, 7, 0x80).message(), Catch::Contains("scale"));  // negative scale
  CHECK_THAT(corrupt(CodecKind::kInt4, 3, 0xff).message(), Catch::Contains("scale"));  // negative scale
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<uint8_t> p;
    REQUIRE(Encode({CodecKind::kInt4, 64, 0}, x, &p).ok());
    std::memcpy(p.data() + 4, &bad, 4);
    CHECK_THAT(Decode({CodecKind::kInt4, 64, 0}, p, y).message(), Catch::Contains("scale"));
  }
  // bf16 and fp32 payloads carrying NaN or Inf.
  for (uint32_t bits : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u}) {
    std::vector<uint8_t> p;
    REQUIRE(Encode({CodecKind::kFp32, 64, 0}, x, &p).ok());
    std::memcpy(p.data() + 4 * 3, &bits, 4);
    CHECK_THAT(Decode({CodecKind::kFp32, 64, 0}, p, y).message(), Catch::Contains("NaN/Inf at index 3"));
    REQUIRE(Encode({CodecKind::kBf16, 64, 0}, x, &p).ok());
    const uint16_t half = uint16_t(bits >> 16);
    std::memcpy(p.data() + 2 * 4, &half, 2);
    CHECK_THAT(Decode({CodecKind::kBf16, 64, 0}, p, y).message(), Catch::Contains("NaN/Inf at index 4"));
  }

  // Random byte mutations of top-k payloads (both index formats): a Status either way, and
  // whatever decodes is finite.
  std::mt19937 rng(11);
  for (double topk : {0.05, 0.5}) {
    for (CodecKind kind : kAllKinds) {
      const CodecOptions opt{kind, 32, topk};
      std::vector<uint8_t> good;
      REQUIRE(Encode(opt, x, &good).ok());
      int rejected = 0;
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<uint8_t> p = good;
        const int flips = 1 + int(rng() % 3);
        for (int f = 0; f < flips; ++f) p[rng() % p.size()] ^= uint8_t(1u << (rng() % 8));
        if (trial % 10 == 0) p.resize(rng() % p.size());
        if (Decode(opt, p, y).ok()) {
          for (float v : y) REQUIRE(std::isfinite(v));
        } else {
          ++rejected;
        }
      }
      CHECK(rejected > 0);
    }
  }
}

TEST_CASE("codec: top-k keeps exactly the k largest magnitudes", "[unit][net]") {
  const size_t n = 10007;
  const std::vector<float> x = Gaussian(n, 21);
  for (double fraction : {0.01, 0.1, 0.3}) {
    const size_t k = TopkCount(fraction, n);
    REQUIRE(k == size_t(std::llround(fraction * n)));
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    std::vector<bool> want(n, false);
    for (size_t j = 0; j < k; ++j) want[order[j]] = true;

    std::vector<uint8_t> p;
    const std::vector<float> y = RoundTrip({CodecKind::kFp32, 64, fraction}, x, &p);
    for (size_t i = 0; i < n; ++i) REQUIRE(y[i] == (want[i] ? x[i] : 0.0f));
    // The smaller index encoding: varint gaps at low density, the bitmap at 0.3.
    const uint8_t format = p[0];
    CHECK(format == (fraction < 0.125 ? 2 : 1));
    const size_t bitmap = (n + 7) / 8;
    uint32_t index_bytes;
    std::memcpy(&index_bytes, p.data() + 4, 4);
    CHECK(index_bytes <= bitmap);
    CHECK(p.size() == kTopkHeaderBytes + index_bytes + EncodedBytes(CodecKind::kFp32, k, 64));
    CHECK(p.size() <= MaxEncodedBytes({CodecKind::kFp32, 64, fraction}, n));

    // With int4 values: the same positions, values within the int4 error.
    const std::vector<float> z = RoundTrip({CodecKind::kInt4, 64, fraction}, x);
    std::vector<float> kept_x, kept_z;
    for (size_t i = 0; i < n; ++i) {
      if (!want[i]) REQUIRE(z[i] == 0.0f);
      if (want[i]) {
        kept_x.push_back(x[i]);
        kept_z.push_back(z[i]);
      }
    }
    CHECK(RelL2(kept_x, kept_z) < 0.12);
  }
  // Ties go to the lower index; one value is kept at the least.
  const std::vector<float> flat(100, -2.0f);
  const std::vector<float> y = RoundTrip({CodecKind::kFp32, 64, 0.05}, flat);
  for (size_t i = 0; i < 100; ++i) REQUIRE(y[i] == (i < 5 ? -2.0f : 0.0f));
  CHECK(TopkCount(1e-9, 100) == 1);
  CHECK(TopkCount(0.999, 100) == 100);
  CHECK(TopkCount(0.5, 0) == 0);
  const std::vector<float> empty;
  CHECK(RoundTrip({CodecKind::kInt4, 64, 0.1}, empty).empty());
}

TEST_CASE("codec: error feedback keeps the sum of decoded deltas on the true sum", "[unit][net]") {
  const size_t n = 8191;
  // drift = 0: i.i.d. Gaussian deltas, the hardest case: the sum grows only as sqrt(steps).
  // drift = 1: each delta is a fixed direction plus as much fresh noise, as consecutive outer
  // gradients of one fragment are positively correlated.
  for (float drift : {0.0f, 1.0f}) {
    for (CodecKind kind : {CodecKind::kInt8, CodecKind::kInt4}) {
      ErrorFeedback ef({kind, 64, 0});
      const CodecOptions opt = ef.options();
      const std::vector<float> direction = Gaussian(n, 999, 0.01f);
      std::vector<double> true_sum(n, 0), ef_sum(n, 0), plain_sum(n, 0);
      std::vector<float> decoded(n);
      std::vector<uint8_t> payload;
      for (int step = 0; step < 100; ++step) {
        std::vector<float> delta = Gaussian(n, 1000 + step, 0.01f);
        for (size_t i = 0; i < n; ++i) delta[i] += drift * direction[i];
        REQUIRE(ef.Encode(7, delta, &payload).ok());
        REQUIRE(Decode(opt, payload, decoded).ok());
        for (size_t i = 0; i < n; ++i) ef_sum[i] += decoded[i];
        REQUIRE(Encode(opt, delta, &payload).ok());
        REQUIRE(Decode(opt, payload, decoded).ok());
        for (size_t i = 0; i < n; ++i) {
          plain_sum[i] += decoded[i];
          true_sum[i] += delta[i];
        }
      }
      auto rel = [&](const std::vector<double>& s) {
        double num = 0, den = 0;
        for (size_t i = 0; i < n; ++i) {
          num += (s[i] - true_sum[i]) * (s[i] - true_sum[i]);
          den += true_sum[i] * true_sum[i];
        }
        return std::sqrt(num / den);
      };
      const double with_ef = rel(ef_sum), without_ef = rel(plain_sum);
      INFO("codec " << int(kind) << " drift " << drift << " rel L2 of the sum: with EF " << with_ef << ", without "
                    << without_ef);
      // With EF the error of the sum is the last residual: about one message's error (int4
      // ~9%) over |sum| (sqrt(100) = 10 deltas for i.i.d. deltas), i.e. ~0.9% for i.i.d. int4,
      // the hardest case; without EF the errors add up as sqrt(100) (10x worse).
      CHECK(with_ef <= 0.01);
      CHECK(with_ef * 5 < without_ef);
      // What is still owed is exactly the residual.
      const std::span<const float> r = ef.residual(7);
      REQUIRE(r.size() == n);
      for (size_t i = 0; i < n; i += 97) CHECK(std::fabs(true_sum[i] - ef_sum[i] - r[i]) < 1e-5);
    }
  }
}

TEST_CASE("codec: error feedback state per fragment, errors leave it untouched", "[unit][net]") {
  ErrorFeedback ef({CodecKind::kInt4, 64, 0});
  std::vector<uint8_t> p;
  const std::vector<float> a = Gaussian(300, 1), b = Gaussian(500, 2);
  REQUIRE(ef.Encode(0, a, &p).ok());
  REQUIRE(ef.Encode(1, b, &p).ok());
  CHECK(ef.residual(0).size() == 300);
  CHECK(ef.residual(1).size() == 500);
  CHECK(ef.residual(2).empty());
  const std::vector<float> before(ef.residual(0).begin(), ef.residual(0).end());

  std::vector<float> bad = a;
  bad[42] = std::numeric_limits<float>::quiet_NaN();
  const Status st = ef.Encode(0, bad, &p);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("fragment 0") && Catch::Contains("index 42"));
  CHECK(std::equal(before.begin(), before.end(), ef.residual(0).begin()));
  CHECK_FALSE(ef.Encode(0, b, &p).ok());  // fragment 0 changed size
  ef.Reset(0);
  CHECK(ef.residual(0).empty());
  CHECK(ef.Encode(0, b, &p).ok());
}

TEST_CASE("codec: error feedback in pieces over a pool gives the bytes of the tensor-at-a-time sums", "[unit][net]") {
  // Tensors longer than a piece (16384 values), blocks that do not divide it, a tiny one.
  const std::vector<uint64_t> numels = {40000, 7, 20001};
  const size_t n = 60008;
  for (CodecKind kind : kAllKinds) {
    for (int block : {64, 96, 2}) {
      INFO(CodecName(kind) << " block " << block);
      const CodecOptions opt{kind, block, 0};
      ErrorFeedback ef(opt);
      TaskPool pool(3);
      std::vector<float> residual(n, 0.0f);
      for (uint64_t round = 0; round < 3; round++) {
        const std::vector<float> delta = Gaussian(n, 40 + round, 1e-3f);
        // The reference: sum = residual + delta, encoded tensor by tensor, residual = sum - decoded.
        std::vector<float> sum(n);
        for (size_t i = 0; i < n; i++) sum[i] = round == 0 ? delta[i] : residual[i] + delta[i];
        std::vector<uint8_t> want;
        std::vector<uint64_t> want_bytes;
        REQUIRE(EncodeTensors(opt, sum, numels, &want, &want_bytes).ok());
        std::vector<float> decoded(n);
        REQUIRE(DecodeTensors(opt, want, numels, want_bytes, decoded).ok());
        for (size_t i = 0; i < n; i++) residual[i] = sum[i] - decoded[i];

        std::vector<uint8_t> payload;
        std::vector<uint64_t> bytes;
        REQUIRE(ef.Encode(9, delta, numels, &payload, &bytes, &pool).ok());
        REQUIRE(payload == want);
        REQUIRE(bytes == want_bytes);
        REQUIRE(std::memcmp(ef.residual(9).data(), residual.data(), 4 * n) == 0);
        REQUIRE(std::memcmp(ef.decoded().data(), decoded.data(), 4 * n) == 0);
      }
      // A NaN in a later piece of the last tensor: the error names it; the residual stays.
      std::vector<float> bad = Gaussian(n, 50, 1e-3f);
      bad[40007 + 19000] = std::numeric_limits<float>::quiet_NaN();
      std::vector<uint8_t> payload;
      std::vector<uint64_t> bytes;
      const Status st = ef.Encode(9, bad, numels, &payload, &bytes, &pool);
      REQUIRE_FALSE(st.ok());
      CHECK_THAT(st.message(), Catch::Contains("tensor 2") && Catch::Contains("index 19000 is NaN"));
      CHECK(std::memcmp(ef.residual(9).data(), residual.data(), 4 * n) == 0);
    }
  }
}

TEST_CASE("codec: several tensors in one payload, each encoded on its own", "[unit][net]") {
  const std::vector<uint64_t> numels = {100, 1, 64, 257};
  const std::vector<float> x = Gaussian(422, 8);
  for (CodecKind kind : kAllKinds) {
    for (double topk : {0.0, 0.1}) {
      const CodecOptions opt{kind, 32, topk};
      std::vector<uint8_t> payload;
      std::vector<uint64_t> bytes;
      REQUIRE(EncodeTensors(opt, x, numels, &payload, &bytes).ok());
      REQUIRE(bytes.size() == numels.size());
      REQUIRE(std::accumulate(bytes.begin(), bytes.end(), uint64_t{0}) == payload.size());
      std::vector<float> y(x.size());
      REQUIRE(DecodeTensors(opt, payload, numels, bytes, y).ok());
      size_t offset = 0, at = 0;
      for (size_t t = 0; t < numels.size(); ++t) {
        if (topk == 0) REQUIRE(bytes[t] == EncodedBytes(kind, numels[t], 32));
        // The same as encoding the tensor alone.
        std::vector<uint8_t> alone;
        REQUIRE(Encode(opt, std::span(x).subspan(offset, numels[t]), &alone).ok());
        REQUIRE(std::equal(alone.begin(), alone.end(), payload.begin() + at, payload.begin() + at + bytes[t]));
        if (topk > 0) {
          const size_t kept = size_t(
              std::count_if(y.begin() + offset, y.begin() + offset + numels[t], [](float v) { return v != 0.0f; }));
          REQUIRE(kept == TopkCount(topk, numels[t]));
        }
        offset += numels[t];
        at += bytes[t];
      }
      // The same payload cut into pieces (as received chunks), at every position: the same values.
      for (size_t cut1 = 0; cut1 <= payload.size(); cut1 += 7) {
        const size_t cut2 = std::min(payload.size(), cut1 + 50);
        const std::span<const uint8_t> all(payload);
        const std::vector<std::span<const uint8_t>> pieces = {all.first(cut1), all.subspan(cut1, cut2 - cut1),
                                                              all.subspan(cut2)};
        std::vector<float> z(x.size(), -1.0f);
        const Status pst = DecodeTensors(opt, pieces, numels, bytes, z);
        INFO("cuts " << cut1 << ", " << cut2 << ": " << pst.message());
        REQUIRE(pst.ok());
        REQUIRE(std::memcmp(z.data(), y.data(), 4 * y.size()) == 0);
      }
      // Mismatched sizes are errors.
      std::vector<uint64_t> wrong = bytes;
      wrong[1] += 1;
      CHECK_FALSE(DecodeTensors(opt, payload, numels, wrong, y).ok());
      const std::span<const uint8_t> all(payload);
      const std::vector<std::span<const uint8_t>> two = {all.first(10), all.subspan(10)};
      CHECK_FALSE(DecodeTensors(opt, two, numels, wrong, y).ok());
      const std::vector<std::span<const uint8_t>> short_pieces = {all.first(10), all.subspan(10, all.size() - 11)};
      CHECK_FALSE(DecodeTensors(opt, short_pieces, numels, bytes, y).ok());
      CHECK_FALSE(DecodeTensors(opt, payload, std::vector<uint64_t>{100, 1, 64}, bytes, y).ok());
      std::vector<float> short_out(x.size() - 1);
      CHECK_FALSE(DecodeTensors(opt, payload, numels, bytes, short_out).ok());
    }
  }
  std::vector<uint8_t> payload = {1};
  std::vector<uint64_t> bytes = {1};
  CHECK_FALSE(EncodeTensors({}, x, std::vector<uint64_t>{100, 1}, &payload, &bytes).ok());
  CHECK(payload.empty());
  std::vector<float> bad = x;
  bad[165 + 5] = std::numeric_limits<float>::infinity();
  const Status st = EncodeTensors({}, bad, numels, &payload, &bytes);
  CHECK_THAT(st.message(), Catch::Contains("tensor 3") && Catch::Contains("index 5 is Inf"));

  // Error feedback over a multi-tensor fragment: residual = sum - decoded, tensor by tensor.
  ErrorFeedback ef({CodecKind::kInt4, 64, 0});
  REQUIRE(ef.Encode(3, x, numels, &payload, &bytes).ok());
  std::vector<float> y(x.size());
  REQUIRE(DecodeTensors(ef.options(), payload, numels, bytes, y).ok());
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(ef.residual(3)[i] == x[i] - y[i]);
}

TEST_CASE("codec: EncodedBytes matches the layout for every size and block", "[unit][net]") {
  for (CodecKind kind : kAllKinds)
    for (size_t block : {2, 32, 64, 128, 256, 4096})
      for (size_t n = 0; n < 600; ++n) REQUIRE(EncodedBytes(kind, n, int(block)) == ExpectedDenseBytes(kind, n, block));
}

}  // namespace diloco

// ---- topk_chunked ----

namespace diloco {
namespace {

CodecOptions Chunked(int chunk, int keep, int bits) { return {CodecKind::kTopkChunked, chunk, 0, keep, bits}; }

// The value a kept x decodes to, by the pinned rule (kernels/sync_sparse.h), from its chunk's
// bin width w.
float ChunkedLevel(float x, float w, int bits) {
  const int L = 1 << bits;
  const float inv = 1.0f / w;
  const float u = std::clamp(std::floor(x * inv), -float(L / 2), float(L / 2 - 1));
  return (u + 0.5f) * w;
}

}  // namespace

TEST_CASE("codec: topk_chunked keeps each chunk's largest, sizes exact", "[unit][net]") {
  for (int chunk : {2, 64, 100, 4096}) {
    for (int keep : {1, 3, 64}) {
      if (keep > chunk) continue;
      for (int bits : {2, 4, 8}) {
        for (size_t n : {size_t{1}, size_t{95}, size_t(chunk), size_t(chunk) + 1, size_t(3 * chunk + 37)}) {
          const CodecOptions opt = Chunked(chunk, keep, bits);
          REQUIRE(ValidateCodecOptions(opt).ok());
          const std::vector<float> x = Gaussian(n, 100 + n + chunk + keep + bits);
          std::vector<uint8_t> p;
          const std::vector<float> y = RoundTrip(opt, x, &p);
          INFO("chunk " << chunk << " keep " << keep << " bits " << bits << " n " << n);
          REQUIRE(p.size() == TopkChunkedBytes(n, chunk, keep, bits));
          REQUIRE(p.size() == MaxEncodedBytes(opt, n));
          std::vector<uint8_t> again;
          REQUIRE(Encode(opt, x, &again).ok());
          REQUIRE(again == p);  // deterministic
          for (size_t lo = 0; lo < n; lo += chunk) {
            const size_t len = std::min<size_t>(chunk, n - lo);
            const size_t kc = std::min(len, std::max<size_t>(1, (size_t(keep) * len + chunk - 1) / chunk));
            // The kc largest |x| (ties to the lower index), by sorting.
            std::vector<size_t> order(len);
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(),
                             [&](size_t a, size_t b) { return std::fabs(x[lo + a]) > std::fabs(x[lo + b]); });
            std::vector<size_t> kept(order.begin(), order.begin() + kc);
            std::sort(kept.begin(), kept.end());
            double ss = 0;
            for (size_t i : kept) ss += double(x[lo + i]) * double(x[lo + i]);
            const float w = float(std::sqrt(ss / double(kc)) * (2.0 * 1.25 / (1 << bits)));
            std::vector<float> want(len, 0.0f);
            for (size_t i : kept) want[i] = ChunkedLevel(x[lo + i], w, bits);
            for (size_t i = 0; i < len; i++) REQUIRE(y[lo + i] == want[i]);
          }
        }
      }
    }
  }
}

TEST_CASE("codec: topk_chunked layout by hand", "[unit][net]") {
  // chunk 8 (3-bit indices), keep 2, 2 bits; 10 values: a full chunk keeping 2, then a chunk of 2
  // keeping ceil(2 * 2 / 8) = 1.
  const std::vector<float> x = {0.1f, -4.0f, 0.5f, 4.0f, 0.0f, -0.2f, 1.0f, 0.3f, 2.0f, -3.0f};
  std::vector<uint8_t> p;
  REQUIRE(Encode(Chunked(8, 2, 2), x, &p).ok());
  REQUIRE(p.size() == 8 + (4 + 1 + 1) + (4 + 1 + 1));
  CHECK(p[0] == 1);
  CHECK(p[1] == 2);
  CHECK(p[2] == 0);
  CHECK(p[3] == 0);
  uint32_t keep;
  std::memcpy(&keep, p.data() + 4, 4);
  CHECK(keep == 2);
  // Chunk 0 keeps indices 1 and 3 (|x| = 4, the tie goes to the lower index first, both kept):
  // sigma = 4, w = 4 * 2.5 / 4 = 2.5; codes floor(-4 / 2.5) = -2 -> 0, floor(4 / 2.5) = 1 -> 3.
  float w;
  std::memcpy(&w, p.data() + 8, 4);
  CHECK(w == 2.5f);
  CHECK(p[12] == (1 | (3 << 3)));  // indices 1, 3 in 3 bits each, LSB first; pad 0
  CHECK(p[13] == (0 | (3 << 2)));  // codes 0, 3
  // Chunk 1 keeps index 1 (-3): sigma 3, w = 1.875, code floor(-3 / 1.875) = -2 -> 0.
  std::memcpy(&w, p.data() + 14, 4);
  CHECK(w == 1.875f);
  CHECK(p[18] == 1);
  CHECK(p[19] == 0);
  std::vector<float> y(x.size());
  REQUIRE(Decode(Chunked(8, 2, 2), p, y).ok());
  CHECK(y == std::vector<float>{0, -3.75f, 0, 3.75f, 0, 0, 0, 0, 0, -2.8125f});

  // Ties by index: equal magnitudes keep the lowest indices.
  const std::vector<float> flat(16, -1.0f);
  REQUIRE(Encode(Chunked(16, 3, 4), flat, &p).ok());
  REQUIRE(Decode(Chunked(16, 3, 4), p, std::span<float>(y.data(), 0)).ok() == false);  // wrong length
  std::vector<float> z(16);
  REQUIRE(Decode(Chunked(16, 3, 4), p, z).ok());
  for (size_t i = 0; i < 16; i++) CHECK((z[i] != 0) == (i < 3));

  // A zero chunk: bin width 0, neutral codes, zeros out.
  const std::vector<float> zeros(8, 0.0f);
  REQUIRE(Encode(Chunked(8, 2, 2), zeros, &p).ok());
  std::memcpy(&w, p.data() + 8, 4);
  CHECK(w == 0.0f);
  CHECK(p[13] == (2 | (2 << 2)));
  std::vector<float> out(8, 7.0f);
  REQUIRE(Decode(Chunked(8, 2, 2), p, out).ok());
  for (float v : out) CHECK(v == 0.0f);
}

TEST_CASE("codec: topk_chunked at the defaults: 0.0283 bytes a parameter", "[unit][net]") {
  const size_t n = size_t{4096} * 256;
  const std::vector<float> x = Gaussian(n, 31);
  const CodecOptions opt = Chunked(4096, 64, 2);
  std::vector<uint8_t> p;
  const std::vector<float> y = RoundTrip(opt, x, &p);
  const double per_param = double(p.size()) / double(n);
  // 0.02832: 12-bit indices + 2-bit codes + an f32 width per 4096 values (+ the 8-byte header)
  CHECK(per_param == Approx(116.0 / 4096 + 8.0 / n).epsilon(1e-9));
  CHECK(per_param < 0.0284);
  // Of N(0, 1) the top 64 of 4096 hold ~12% of the energy; 2-bit codes lose 12% of that.
  const double err = RelL2(x, y);
  CHECK(err > 0.9);
  CHECK(err < 0.95);
  CHECK(ValidateCodecOptions(Chunked(4096, 0, 2)).message().find("keep 0") != std::string::npos);
  CHECK(ValidateCodecOptions(Chunked(4096, 4097, 2)).message().find("keep 4097") != std::string::npos);
  CHECK(ValidateCodecOptions(Chunked(4096, 64, 3)).message().find("value bits 3") != std::string::npos);
  CHECK(!ValidateCodecOptions(Chunked(4095, 64, 2)).ok());
  CHECK(!ValidateCodecOptions({CodecKind::kTopkChunked, 4096, 0.1, 64, 2}).ok());
  std::vector<float> bad = Gaussian(5000, 3);
  bad[4321] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(Encode(opt, bad, &p).message(), Catch::Contains("index 4321"));
  CHECK(p.empty());
}

TEST_CASE("codec: corrupted topk_chunked payloads are rejected, never decoded to garbage", "[unit][net]") {
  const std::vector<float> x = Gaussian(300, 9);
  const CodecOptions opt = Chunked(128, 8, 2);  // chunks 128, 128, 44 (keep 8, 8, 3); 7-bit indices
  std::vector<uint8_t> good;
  REQUIRE(Encode(opt, x, &good).ok());
  const size_t rec = 4 + 7 + 2;  // 8 * 7 bits, 8 * 2 bits
  REQUIRE(good.size() == 8 + 2 * rec + (4 + 3 + 1));
  std::vector<float> y(x.size());
  auto with = [&](size_t at, uint8_t value) {
    std::vector<uint8_t> p = good;
    p.at(at) = value;
    return Decode(opt, p, y);
  };
  CHECK_THAT(with(0, 2).message(), Catch::Contains("unknown format 2"));
  CHECK_THAT(with(1, 3).message(), Catch::Contains("value bits 3"));
  CHECK_THAT(with(2, 1).message(), Catch::Contains("reserved"));
  CHECK_THAT(with(4, 0).message(), Catch::Contains("keeps 0"));
  CHECK_THAT(with(4, 200).message(), Catch::Contains("keeps 200"));
  CHECK_THAT(with(4, 9).message(), Catch::Contains("bytes, but"));   // keep 9: another size
  CHECK_THAT(with(1, 4).message(), Catch::Contains("bytes, but"));   // 4 bits: another size
  CHECK_THAT(with(8 + 3, 0x80).message(), Catch::Contains("bin width"));  // negative width
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 3e38f}) {
    std::vector<uint8_t> p = good;  // NaN, Inf, or so large that 1.5 w overflows
    std::memcpy(p.data() + 8, &bad, 4);
    CHECK_THAT(Decode(opt, p, y).message(), Catch::Contains("bin width"));
  }
  CHECK_THAT(with(8 + 4, 0xff).message(), Catch::Contains("index"));      // first index 127, then smaller
  CHECK_THAT(with(8 + rec + 4, 0xff).message(), Catch::Contains("chunk at value 128"));
  {
    std::vector<uint8_t> p = good;  // the last chunk's index 43 < 44 at most: write 127
    p[8 + 2 * rec + 4] = 0x7f;
    CHECK_THAT(Decode(opt, p, y).message(), Catch::Contains("index"));
  }
  {
    std::vector<uint8_t> p = good;  // pad bits of the last chunk's codes (3 x 2 bits of 8)
    p.back() |= 0x80;
    CHECK_THAT(Decode(opt, p, y).message(), Catch::Contains("pad"));
  }
  {
    std::vector<uint8_t> p = good;  // a zero chunk with codes that are not neutral
    std::memset(p.data() + 8, 0, 4);
    const Status st = Decode(opt, p, y);
    if (!st.ok()) CHECK_THAT(st.message(), Catch::Contains("zero chunk"));
  }
  {
    std::vector<uint8_t> p = good;
    p.pop_back();
    CHECK_THAT(Decode(opt, p, y).message(), Catch::Contains("bytes, but"));
    p.resize(5);
    CHECK_THAT(Decode(opt, p, y).message(), Catch::Contains("header"));
  }
  // Random mutations: a Status either way, and whatever decodes is finite with at most the kept
  // count of nonzeros.
  std::mt19937 rng(12);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> p = good;
    const int flips = 1 + int(rng() % 3);
    for (int f = 0; f < flips; ++f) p[rng() % p.size()] ^= uint8_t(1u << (rng() % 8));
    if (trial % 10 == 0) p.resize(rng() % p.size());
    if (Decode(opt, p, y).ok()) {
      size_t nonzero = 0;
      for (float v : y) {
        REQUIRE(std::isfinite(v));
        nonzero += v != 0;
      }
      REQUIRE(nonzero <= 19);
    } else {
      ++rejected;
    }
  }
  CHECK(rejected > 300);
}

TEST_CASE("codec: error feedback as a decaying accumulator", "[unit][net]") {
  const size_t n = 5000;
  for (const CodecOptions& opt : {CodecOptions{CodecKind::kInt4, 64, 0}, Chunked(1024, 16, 2)}) {
    // decay 1 is the plain residual, bit for bit.
    ErrorFeedback plain(opt), acc1(opt, {FeedbackRule::kAccumulate, 1.0});
    ErrorFeedback acc(opt, {FeedbackRule::kAccumulate, 0.95});
    std::vector<float> e(n, 0.0f);  // the accumulator by hand
    std::vector<float> sent_sum(n, 0.0f), true_sum(n, 0.0f);
    for (int round = 0; round < 6; round++) {
      const std::vector<float> d = Gaussian(n, 50 + round, 0.01f);
      std::vector<uint8_t> p1, p2, p3;
      REQUIRE(plain.Encode(0, d, &p1).ok());
      REQUIRE(acc1.Encode(0, d, &p2).ok());
      REQUIRE(p1 == p2);
      REQUIRE(std::equal(plain.residual(0).begin(), plain.residual(0).end(), acc1.residual(0).begin()));
      for (size_t i = 0; i < n; i++) {
        volatile float decayed = 0.95f * e[i];  // two roundings, no FMA
        e[i] = decayed + d[i];
      }
      REQUIRE(acc.Encode(0, d, &p3).ok());
      std::vector<uint8_t> want;
      REQUIRE(Encode(opt, e, &want).ok());
      REQUIRE(p3 == want);  // C(e)
      std::vector<float> dec(n);
      REQUIRE(Decode(opt, p3, dec).ok());
      for (size_t i = 0; i < n; i++) e[i] = e[i] - dec[i];
      REQUIRE(std::equal(e.begin(), e.end(), acc.residual(0).begin()));  // e - decode(C(e))
    }
  }
  // Pieces over a pool: the same bytes and accumulator as one tensor at a time.
  TaskPool pool(3);
  const CodecOptions opt{CodecKind::kInt8, 64, 0};
  const FeedbackOptions fb{FeedbackRule::kAccumulate, 0.9};
  ErrorFeedback one(opt, fb), pieces(opt, fb);
  const std::vector<uint64_t> numels = {40000, 123};
  for (int round = 0; round < 3; round++) {
    const std::vector<float> d = Gaussian(40123, 70 + round);
    std::vector<uint8_t> a, b;
    std::vector<uint64_t> ta, tb;
    REQUIRE(one.Encode(1, d, numels, &a, &ta).ok());
    REQUIRE(pieces.Encode(1, d, numels, &b, &tb, &pool).ok());
    REQUIRE(a == b);
    REQUIRE(std::equal(one.residual(1).begin(), one.residual(1).end(), pieces.residual(1).begin()));
  }
}

TEST_CASE("codec: topk_chunked over several tensors", "[unit][net]") {
  const CodecOptions opt = Chunked(4096, 64, 2);
  const std::vector<uint64_t> numels = {10000, 96, 4096};
  const std::vector<float> x = Gaussian(10000 + 96 + 4096, 77);
  std::vector<uint8_t> p;
  std::vector<uint64_t> tb;
  REQUIRE(EncodeTensors(opt, x, numels, &p, &tb).ok());
  size_t total = 0;
  for (size_t t = 0; t < numels.size(); t++) {
    CHECK(tb[t] == TopkChunkedBytes(numels[t], 4096, 64, 2));
    total += tb[t];
  }
  CHECK(p.size() == total);
  std::vector<float> y(x.size());
  // The decoder's options come from the wire: keep and bits are in the payload.
  REQUIRE(DecodeTensors({CodecKind::kTopkChunked, 4096, 0}, p, numels, tb, y).ok());
  std::vector<float> z(x.size());
  size_t at = 0, off = 0;
  for (size_t t = 0; t < numels.size(); t++) {
    REQUIRE(Decode(opt, std::span(p.data() + at, tb[t]), std::span(z.data() + off, numels[t])).ok());
    at += tb[t];
    off += numels[t];
  }
  CHECK(y == z);
}

}  // namespace diloco
