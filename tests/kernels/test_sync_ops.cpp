// The engine's sync-path ops (kernels/sync_ops.h): outer delta, fold, and
// the codec reference, which must write the same bytes as the wire codec
// (daemon/net/codec.h) — the CUDA codec kernels are checked against it.
#include "kernels/sync_ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "daemon/net/codec.h"
#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

TEST_CASE("outer delta and the three folds", "[unit][kernels]") {
  const std::vector<float> base = {1.0f, 2.0f, -1.0f}, theta0 = {0.5f, 2.5f, -1.0f};
  std::vector<float> delta(3);
  outer_delta(delta.data(), base.data(), theta0.data(), 3);
  CHECK(delta == std::vector<float>{0.5f, -0.5f, 0.0f});

  const std::vector<float> global = {10.0f, 20.0f, 30.0f}, at_send = {0.0f, 2.0f, -2.0f};
  std::vector<float> t = theta0;
  fold(t.data(), global.data(), nullptr, FoldMode::kOverwrite, 0.0f, 3);
  CHECK(t == global);
  t = theta0;
  fold(t.data(), global.data(), at_send.data(), FoldMode::kReplay, 0.0f, 3);
  CHECK(t == std::vector<float>{10.5f, 20.5f, 31.0f});
  t = theta0;
  fold(t.data(), global.data(), nullptr, FoldMode::kMix, 0.25f, 3);
  CHECK(t == std::vector<float>{0.25f * 0.5f + 0.75f * 10.0f, 0.25f * 2.5f + 0.75f * 20.0f,
                                0.25f * -1.0f + 0.75f * 30.0f});
}

namespace {

CodecKind to_wire(SyncCodec k) { return static_cast<CodecKind>(static_cast<int>(k)); }

// Random values with the cases a codec must get right: zeros, a zero
// block, one tiny block, ties for round-half-even.
std::vector<float> codec_input(size_t n, int block, uint64_t seed) {
  std::vector<float> x = random_vec<float>(n, seed, 0.01);
  if (n > 3) x[3] = 0.0f;
  if (n >= (size_t)2 * block)
    for (int i = 0; i < block; i++) x[block + i] = 0.0f;  // an all-zero block
  if (n > 5) x[5] = x[4] * 0.5f;
  return x;
}

}  // namespace

TEST_CASE("codec reference writes the wire codec's bytes, with the same error feedback", "[unit][kernels]") {
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

TEST_CASE("codec reference rejects what the wire codec rejects", "[unit][kernels]") {
  const size_t n = 65;
  const int block = 64;
  std::vector<float> x = random_vec<float>(n, 5);
  std::vector<float> residual(n, 0.0f);
  const std::vector<float> saved = residual;
  // NaN input: refused, residual untouched.
  x[10] = std::numeric_limits<float>::quiet_NaN();
  for (SyncCodec kind : {SyncCodec::kFp32, SyncCodec::kBf16, SyncCodec::kInt8, SyncCodec::kInt4}) {
    std::vector<uint8_t> p(sync_payload_bytes(kind, n, block));
    CHECK_FALSE(sync_encode(p.data(), residual.data(), x.data(), kind, block, n));
    CHECK(residual == saved);
  }
  // bf16 overflow of a finite value.
  x[10] = std::numeric_limits<float>::max();
  std::vector<uint8_t> pb(sync_payload_bytes(SyncCodec::kBf16, n, block));
  CHECK_FALSE(sync_encode(pb.data(), nullptr, x.data(), SyncCodec::kBf16, block, n));
  // Corrupt payloads: int8 code -128, negative scale, odd pad nibble (every int4 code is a level).
  x[10] = 1.0f;
  std::vector<float> out(n);
  std::vector<uint8_t> p8(sync_payload_bytes(SyncCodec::kInt8, n, block));
  REQUIRE(sync_encode(p8.data(), nullptr, x.data(), SyncCodec::kInt8, block, n));
  REQUIRE(sync_decode(out.data(), p8.data(), SyncCodec::kInt8, block, n));
  p8[8 + 3] = 0x80;
  CHECK_FALSE(sync_decode(out.data(), p8.data(), SyncCodec::kInt8, block, n));
  std::vector<uint8_t> p4(sync_payload_bytes(SyncCodec::kInt4, n, block));
  REQUIRE(sync_encode(p4.data(), nullptr, x.data(), SyncCodec::kInt4, block, n));
  std::vector<uint8_t> bad = p4;
  bad[8] = 0x08;
  CHECK(sync_decode(out.data(), bad.data(), SyncCodec::kInt4, block, n));
  bad = p4;
  bad[3] |= 0x80;  // sign bit of the first scale
  CHECK_FALSE(sync_decode(out.data(), bad.data(), SyncCodec::kInt4, block, n));
  bad = p4;
  bad.back() |= 0x10;  // n is odd: the last high nibble is padding
  CHECK_FALSE(sync_decode(out.data(), bad.data(), SyncCodec::kInt4, block, n));
}

}  // namespace diloco
