// The engine's sync-path ops (kernels/sync_ops.h): outer delta, fold, and
// the dense codecs, THE CPU implementation (the wire codec, daemon/net/codec.h,
// calls it; the CUDA codec kernels are checked against it in test_cuda_ops.cpp).
// The contract: the pinned arithmetic of kernels/sync_ops.h, restated here as
// plain per-value formulas, gives the same bytes; tie cases give pinned bytes.
#include "kernels/sync_ops.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "daemon/net/codec.h"
#include "daemon/sync/fold.h"
#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- the rules of kernels/sync_ops.h, one value at a time ----

float spec_fold(FoldMode mode, double alpha, float theta, float global, float at_send) {
  const float a = static_cast<float>(alpha), b = static_cast<float>(1.0 - alpha);
  switch (mode) {
    case FoldMode::kOverwrite: return global;
    case FoldMode::kReplay: return global + (theta - at_send);
    case FoldMode::kMix: return std::fma(a, theta, b * global);  // no product here can be fused
  }
  return 0.0f;
}

uint16_t spec_bf16(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// round-half-even of the exact product: one rounding of x * inv + 1.5 * 2^23.
int spec_int8_code(float x, float inv) {
  const int q = std::bit_cast<int32_t>(std::fma(x, inv, 12582912.0f)) - 0x4b400000;
  return std::max(-127, std::min(127, q));
}

int spec_int4_code(float v) {
  int m = 0;
  for (int k = 0; k < 7; k++) m += std::fabs(v) > 0.5f * (kSyncInt4Levels[8 + k] + kSyncInt4Levels[9 + k]);
  return v < 0.0f ? 7 - m : 8 + m;
}

// The payload of finite x by the rules above.
std::vector<uint8_t> spec_encode(const std::vector<float>& x, SyncCodec kind, int block) {
  const size_t n = x.size(), nb = (n + block - 1) / block;
  std::vector<uint8_t> p(sync_payload_bytes(kind, n, block), 0);
  auto put_f32 = [&](size_t at, float v) { std::memcpy(p.data() + at, &v, 4); };
  for (size_t i = 0; kind == SyncCodec::kFp32 && i < n; i++) put_f32(4 * i, x[i]);
  for (size_t i = 0; kind == SyncCodec::kBf16 && i < n; i++) {
    const uint16_t h = spec_bf16(x[i]);
    std::memcpy(p.data() + 2 * i, &h, 2);
  }
  if (kind == SyncCodec::kInt8 || kind == SyncCodec::kInt4) {
    for (size_t b = 0; b < nb; b++) {
      const size_t lo = b * block, hi = std::min(n, lo + block);
      float amax = 0.0f;
      for (size_t i = lo; i < hi; i++) amax = std::max(amax, std::fabs(x[i]));
      const bool zero = !std::isfinite(127.0f / amax);
      if (kind == SyncCodec::kInt8) {
        put_f32(4 * b, zero ? 0.0f : std::min(amax / 127.0f, sync_max_scale(127)));
        for (size_t i = lo; i < hi; i++)
          p[4 * nb + i] = static_cast<uint8_t>(static_cast<int8_t>(spec_int8_code(x[i], zero ? 0.0f : 127.0f / amax)));
      } else {
        put_f32(4 * b, zero ? 0.0f : amax);
        const float inv = zero ? 0.0f : 1.0f / amax;
        for (size_t i = lo; i < hi; i++)
          p[4 * nb + i / 2] |= static_cast<uint8_t>(spec_int4_code(x[i] * inv) << (4 * (i % 2)));
      }
    }
  }
  return p;
}

// Random values with the cases a codec must get right: zeros, a zero block,
// and many int8 near-ties (x * 127 / absmax within ~1e-6 of k + 1/2, where a
// rounded product would tie and the exact one does not).
std::vector<float> codec_input(size_t n, int block, uint64_t seed) {
  std::vector<float> x = random_vec<float>(n, seed, 0.01);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 3) {
    const int k = static_cast<int>(rng() % 254) - 127;
    x[i] = static_cast<float>((k + 0.5 + (static_cast<double>(rng() % 2001) - 1000) * 1e-9) * 0.03 / 127.0);
  }
  for (size_t b = 0; b < n; b += block) x[b] = 0.03f;  // every block's absmax
  if (n > 3) x[3] = 0.0f;
  if (n >= (size_t)2 * block)
    for (int i = 0; i < block; i++) x[block + i] = 0.0f;  // an all-zero block
  return x;
}

CodecKind to_wire(SyncCodec k) { return static_cast<CodecKind>(static_cast<int>(k)); }

std::vector<uint8_t> encode(const std::vector<float>& x, SyncCodec kind, int block) {
  std::vector<uint8_t> p(sync_payload_bytes(kind, x.size(), block));
  REQUIRE(sync_encode(p.data(), nullptr, x.data(), kind, block, x.size()));
  return p;
}

}  // namespace

TEST_CASE("outer delta and the three folds", "[unit][kernels]") {
  const std::vector<float> base = {1.0f, 2.0f, -1.0f}, theta0 = {0.5f, 2.5f, -1.0f};
  std::vector<float> delta(3);
  outer_delta(delta.data(), base.data(), theta0.data(), 3);
  CHECK(delta == std::vector<float>{0.5f, -0.5f, 0.0f});

  const std::vector<float> global = {10.0f, 20.0f, 30.0f}, at_send = {0.0f, 2.0f, -2.0f};
  std::vector<float> t = theta0;
  fold(t.data(), global.data(), nullptr, FoldMode::kOverwrite, 0.0, 3);
  CHECK(t == global);
  t = theta0;
  fold(t.data(), global.data(), at_send.data(), FoldMode::kReplay, 0.0, 3);
  CHECK(t == std::vector<float>{10.5f, 20.5f, 31.0f});
  t = theta0;
  fold(t.data(), global.data(), nullptr, FoldMode::kMix, 0.25, 3);
  CHECK(t == std::vector<float>{7.625f, 15.625f, 22.25f});  // exact: 0.25 θ + 0.75 Θ
}

TEST_CASE("fold and outer delta are the plain formulas, bit for bit; FoldGlobal is fold", "[unit][kernels]") {
  const size_t n = 10007;
  const auto base = random_vec<float>(n, 1), theta = random_vec<float>(n, 2), global = random_vec<float>(n, 3),
             at_send = random_vec<float>(n, 4);
  std::vector<float> delta(n), want(n);
  outer_delta(delta.data(), base.data(), theta.data(), n);
  for (size_t i = 0; i < n; i++) want[i] = base[i] - theta[i];
  CHECK(same_bits(delta, want));
  // 0.3, 0.9: alpha not a float, where fl32(1 - alpha) != 1.0f - fl32(alpha).
  for (double alpha : {0.0, 0.25, 0.3, 0.5, 0.9, 1.0, 0.123456789}) {
    for (FoldMode mode : {FoldMode::kOverwrite, FoldMode::kReplay, FoldMode::kMix}) {
      INFO("mode " << (int)mode << " alpha " << alpha);
      for (size_t i = 0; i < n; i++) want[i] = spec_fold(mode, alpha, theta[i], global[i], at_send[i]);
      std::vector<float> t = theta;
      fold(t.data(), global.data(), at_send.data(), mode, alpha, n);
      CHECK(same_bits(t, want));
      // The daemon's FoldGlobal: FoldRule in the order of FoldMode, included = theta_at_send.
      std::vector<float> local = theta;
      FoldGlobal(static_cast<FoldRule>(static_cast<int>(mode)), alpha, global.data(), at_send.data(), local.data(), n);
      CHECK(same_bits(local, want));
    }
  }
  static_assert(static_cast<int>(FoldRule::kOverwrite) == static_cast<int>(FoldMode::kOverwrite) &&
                static_cast<int>(FoldRule::kReplay) == static_cast<int>(FoldMode::kReplay) &&
                static_cast<int>(FoldRule::kMix) == static_cast<int>(FoldMode::kMix));
}

TEST_CASE("codec: the pinned rules, value by value, give the payload bytes", "[unit][kernels]") {
  for (SyncCodec kind : {SyncCodec::kFp32, SyncCodec::kBf16, SyncCodec::kInt8, SyncCodec::kInt4}) {
    for (int block : {2, 64, 256}) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{1001}, size_t{4096}}) {
        INFO("codec " << (int)kind << " block " << block << " n " << n);
        const std::vector<float> x = codec_input(n, block, 7 * n + block);
        CHECK(encode(x, kind, block) == spec_encode(x, kind, block));
      }
    }
  }
}

TEST_CASE("codec: the wire codec writes these bytes, with the same error feedback", "[unit][kernels]") {
  for (SyncCodec kind : {SyncCodec::kFp32, SyncCodec::kBf16, SyncCodec::kInt8, SyncCodec::kInt4}) {
    for (int block : {2, 64, 256}) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{1001}, size_t{4096}}) {
        INFO("codec " << (int)kind << " block " << block << " n " << n);
        const size_t bytes = sync_payload_bytes(kind, n, block);
        REQUIRE(bytes == EncodedBytes(to_wire(kind), n, block));
        ErrorFeedback wire_ef(CodecOptions{to_wire(kind), block, 0.0});
        std::vector<float> residual(n, 0.0f);
        for (int round = 0; round < 3; round++) {
          const std::vector<float> delta = codec_input(n, block, 100 + round * 7 + n);
          std::vector<uint8_t> ours(bytes), theirs;
          REQUIRE(sync_encode(ours.data(), residual.data(), delta.data(), kind, block, n));
          REQUIRE(wire_ef.Encode(0, delta, &theirs).ok());
          REQUIRE(theirs.size() == bytes);
          CHECK(std::memcmp(ours.data(), theirs.data(), bytes) == 0);
          const std::span<const float> wire_residual = wire_ef.residual(0);
          REQUIRE(wire_residual.size() == n);
          CHECK(std::memcmp(residual.data(), wire_residual.data(), n * sizeof(float)) == 0);
          std::vector<float> decoded(n), wire_decoded(n);
          REQUIRE(sync_decode(decoded.data(), ours.data(), kind, block, n));
          REQUIRE(DecodeDense(to_wire(kind), block, theirs, wire_decoded).ok());
          CHECK(std::memcmp(decoded.data(), wire_decoded.data(), n * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("codec: ties encode to pinned bytes", "[unit][kernels]") {
  SECTION("int8: round-half-even of the exact product x * 127 / absmax") {
    // absmax 127: scale 1, inv 1; exact ties go to the even code.
    const std::vector<float> x = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f};
    CHECK(encode(x, SyncCodec::kInt8, 64) ==
          std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3f, 127, 0, 2, 2, 0x00, 0xfe, 0xfe, 126});
    // absmax 381: inv = fl(1/3) = 1/3 + 9.9e-9; 7.5 * inv = 2.50000007 exactly, which a rounded
    // product (2.5, a tie) would put on 2: the exact product gives 3.
    const std::vector<float> y = {381.0f, 7.5f, -7.5f, 4.5f};
    CHECK(encode(y, SyncCodec::kInt8, 64) == std::vector<uint8_t>{0x00, 0x00, 0x40, 0x40, 127, 3, 0xfd, 2});
  }
  SECTION("int4: a value on a midpoint takes the level nearer to zero") {
    // absmax 1 (scale 1, inv 1): +-mid_k, the midpoints of the level table.
    std::vector<float> x = {1.0f};
    for (int k = 0; k < 7; k++) {
      const float mid = 0.5f * (kSyncInt4Levels[8 + k] + kSyncInt4Levels[9 + k]);
      x.push_back(mid);
      x.push_back(-mid);
    }
    x.push_back(std::nextafter(0.5f * (kSyncInt4Levels[8] + kSyncInt4Levels[9]), 1.0f));  // just above mid_0
    CHECK(encode(x, SyncCodec::kInt4, 64) == std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3f,  // scale 1
                                                                  0x8f, 0x97, 0xa6, 0xb5, 0xc4, 0xd3, 0xe2, 0x91});
    // A zero block: scale 0, every code 8 (the value x * 0 = +-0 is on level 8's side).
    CHECK(encode({0.0f, -0.0f, 0.0f}, SyncCodec::kInt4, 64) == std::vector<uint8_t>{0, 0, 0, 0, 0x88, 0x08});
  }
  SECTION("bf16: round-to-nearest-even on the bits") {
    const std::vector<float> x = {std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u),
                                  std::bit_cast<float>(0xbf818000u), std::bit_cast<float>(0x00018000u),
                                  std::bit_cast<float>(0x3f807fffu)};
    CHECK(encode(x, SyncCodec::kBf16, 64) ==
          std::vector<uint8_t>{0x80, 0x3f, 0x82, 0x3f, 0x82, 0xbf, 0x02, 0x00, 0x80, 0x3f});
  }
}

TEST_CASE("codec: refusals name the first offending value", "[unit][kernels]") {
  const size_t n = 65;
  const int block = 64;
  std::vector<float> x = random_vec<float>(n, 5);
  std::vector<float> residual(n, 0.0f);
  const std::vector<float> saved = residual;
  // NaN input: refused, residual untouched.
  x[10] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  for (SyncCodec kind : {SyncCodec::kFp32, SyncCodec::kBf16, SyncCodec::kInt8, SyncCodec::kInt4}) {
    std::vector<uint8_t> p(sync_payload_bytes(kind, n, block));
    CHECK_FALSE(sync_encode(p.data(), residual.data(), x.data(), kind, block, n));
    CHECK(residual == saved);
    size_t at = 0;
    CHECK(sync_encode_dense(p.data(), x.data(), kind, block, n, &at) == SyncFault::kNonFinite);
    CHECK(at == 10);
  }
  // bf16 overflow of a finite value.
  x[10] = 1.0f;
  x[20] = std::numeric_limits<float>::max();
  std::vector<uint8_t> pb(sync_payload_bytes(SyncCodec::kBf16, n, block));
  size_t at = 0;
  CHECK(sync_encode_dense(pb.data(), x.data(), SyncCodec::kBf16, block, n, &at) == SyncFault::kBf16Overflow);
  CHECK(at == 20);
  // Corrupt payloads: int8 code -128, negative scale, odd pad nibble (every int4 code is a level).
  x[20] = 2.0f;
  x[40] = 3.0f;
  std::vector<float> out(n);
  std::vector<uint8_t> p8 = encode(x, SyncCodec::kInt8, block);
  REQUIRE(sync_decode(out.data(), p8.data(), SyncCodec::kInt8, block, n));
  p8[8 + 3] = 0x80;
  CHECK(sync_decode_dense(out.data(), p8.data(), SyncCodec::kInt8, block, n, &at) == SyncFault::kBadCode);
  CHECK(at == 3);
  p8[7] |= 0x80;  // and the second scale negative: scales are checked first
  CHECK(sync_decode_dense(out.data(), p8.data(), SyncCodec::kInt8, block, n, &at) == SyncFault::kBadScale);
  CHECK(at == 64);
  const std::vector<uint8_t> p4 = encode(x, SyncCodec::kInt4, block);
  std::vector<uint8_t> bad = p4;
  bad[8] = 0x08;
  CHECK(sync_decode(out.data(), bad.data(), SyncCodec::kInt4, block, n));
  bad = p4;
  bad[3] |= 0x80;  // sign bit of the first scale
  CHECK_FALSE(sync_decode(out.data(), bad.data(), SyncCodec::kInt4, block, n));
  bad = p4;
  bad.back() |= 0x10;  // n is odd: the last high nibble is padding
  CHECK(sync_decode_dense(out.data(), bad.data(), SyncCodec::kInt4, block, n, &at) == SyncFault::kBadPad);
  CHECK(at == n);
  std::vector<uint8_t> pf = encode(x, SyncCodec::kFp32, block);
  std::memcpy(pf.data() + 4 * 30, &x[0], 4);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(pf.data() + 4 * 31, &inf, 4);
  CHECK(sync_decode_dense(out.data(), pf.data(), SyncCodec::kFp32, block, n, &at) == SyncFault::kNonFinite);
  CHECK(at == 31);
}

}  // namespace diloco
