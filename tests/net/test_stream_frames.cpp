// The local control socket's framing (stream_frames.h): round trips, the cap checked from the
// prefix before anything is taken in, truncated and garbage input.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "daemon/net/stream_frames.h"

namespace diloco::net {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::vector<uint8_t> Encode(const std::vector<std::vector<uint8_t>>& frames, const StreamFrameLimits& limits = {}) {
  std::vector<std::span<const uint8_t>> spans(frames.begin(), frames.end());
  std::vector<uint8_t> out;
  REQUIRE(EncodeStreamMessage(spans, limits, &out).ok());
  return out;
}

void PutU32(uint32_t v, std::vector<uint8_t>* out) {
  for (int i = 0; i < 4; i++) out->push_back((uint8_t)(v >> (8 * i)));
}

// A prefix announcing frames of these lengths (no frame bytes).
std::vector<uint8_t> Prefix(const std::vector<uint32_t>& lengths) {
  std::vector<uint8_t> p(std::begin(kStreamMagic), std::end(kStreamMagic));
  PutU32((uint32_t)lengths.size(), &p);
  for (uint32_t l : lengths) PutU32(l, &p);
  return p;
}

TEST_CASE("stream frames: a message round-trips, in pieces of any size", "[unit][net]") {
  const std::vector<std::vector<uint8_t>> frames = {Bytes("header"), {}, std::vector<uint8_t>(70000, 7), Bytes("x")};
  const std::vector<uint8_t> wire = Encode(frames);
  CHECK(wire.size() == kStreamFixedPrefixBytes + 4 * frames.size() + 6 + 70000 + 1);
  std::vector<std::vector<uint8_t>> back;
  REQUIRE(DecodeStreamMessage(wire, {}, &back).ok());
  CHECK(back == frames);

  for (size_t piece : {size_t{1}, size_t{3}, size_t{4096}}) {
    StreamDecoder d;
    size_t at = 0;
    while (at < wire.size()) {
      REQUIRE(d.wanted() > 0);
      size_t taken = 0;
      const size_t n = std::min(piece, wire.size() - at);
      REQUIRE(d.Feed({wire.data() + at, n}, &taken).ok());
      CHECK(taken <= n);
      CHECK(d.buffered_bytes() <= wire.size());
      at += taken;
    }
    REQUIRE(d.complete());
    CHECK(d.wanted() == 0);
    CHECK(d.announced_bytes() == wire.size());
    CHECK(d.Take() == frames);
    CHECK(d.buffered_bytes() == 0);
    CHECK_FALSE(d.mid_message());
  }
}

TEST_CASE("stream frames: the decoder takes no byte past the end of a message", "[unit][net]") {
  std::vector<uint8_t> two = Encode({Bytes("one")});
  const std::vector<uint8_t> second = Encode({Bytes("two"), Bytes("2")});
  two.insert(two.end(), second.begin(), second.end());
  StreamDecoder d;
  size_t taken = 0;
  REQUIRE(d.Feed(two, &taken).ok());
  REQUIRE(d.complete());
  CHECK(taken == two.size() - second.size());
  CHECK(d.Take() == std::vector<std::vector<uint8_t>>{Bytes("one")});
  size_t rest = 0;
  REQUIRE(d.Feed({two.data() + taken, two.size() - taken}, &rest).ok());
  CHECK(rest == second.size());
  CHECK(d.Take() == std::vector<std::vector<uint8_t>>{Bytes("two"), Bytes("2")});
  // Only whole messages: bytes after one are an error for the one-shot decoder.
  std::vector<std::vector<uint8_t>> frames;
  CHECK_FALSE(DecodeStreamMessage(two, {}, &frames).ok());
}

TEST_CASE("stream frames: a length over the cap is refused from the prefix, nothing of it held", "[unit][net]") {
  StreamFrameLimits limits;
  limits.max_message_bytes = 1 << 20;
  // Exactly the cap: accepted.
  const uint32_t fits = (uint32_t)(limits.max_message_bytes - kStreamFixedPrefixBytes - 4);
  {
    StreamDecoder d(limits);
    size_t taken = 0;
    REQUIRE(d.Feed(Prefix({fits}), &taken).ok());
    CHECK(d.announced_bytes() == limits.max_message_bytes);
    CHECK(d.wanted() == fits);
  }
  // One byte more, announced with its bytes following: refused once the lengths are in.
  std::vector<uint8_t> wire = Prefix({fits + 1});
  const size_t prefix = wire.size();
  wire.resize(wire.size() + fits + 1, 0xab);
  StreamDecoder d(limits);
  size_t taken = 0;
  const Status st = d.Feed(wire, &taken);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kRefused);
  CHECK_THAT(st.message(), Catch::Contains("over the cap"));
  CHECK(taken == prefix);  // none of the frame's bytes
  CHECK(d.failed());
  CHECK(d.wanted() == 0);
  CHECK(d.buffered_bytes() == 0);
  size_t more = 0;
  CHECK(d.Feed(wire, &more).ok());  // a failed decoder takes nothing further
  CHECK(more == 0);

  // Several frames whose sum is over the cap, each under it; and lengths that wrap 32 bits.
  std::vector<std::vector<uint8_t>> frames;
  CHECK(DecodeStreamMessage(Prefix({600000, 600000}), limits, &frames).code() == StatusCode::kRefused);
  CHECK(DecodeStreamMessage(Prefix({0xffffffffu, 0xffffffffu, 2}), limits, &frames).code() == StatusCode::kRefused);
  // Too many frames, and none.
  CHECK(DecodeStreamMessage(Prefix(std::vector<uint32_t>(limits.max_frames + 1, 0)), limits, &frames).code() ==
        StatusCode::kRefused);
  CHECK(DecodeStreamMessage(Prefix({}), limits, &frames).code() == StatusCode::kRefused);
  std::vector<uint8_t> huge_count(std::begin(kStreamMagic), std::end(kStreamMagic));
  PutU32(0xffffffffu, &huge_count);
  StreamDecoder h(limits);
  CHECK(h.Feed(huge_count, &taken).code() == StatusCode::kRefused);
  CHECK(taken == kStreamFixedPrefixBytes);

  // The encoder refuses what the decoder would.
  const std::vector<uint8_t> big(limits.max_message_bytes, 1);
  const std::vector<std::span<const uint8_t>> spans = {big};
  std::vector<uint8_t> out = {9};
  CHECK_FALSE(EncodeStreamMessage(spans, limits, &out).ok());
  CHECK(out == std::vector<uint8_t>{9});
  CHECK_FALSE(EncodeStreamMessage({}, limits, &out).ok());
}

TEST_CASE("stream frames: truncated and garbage input are errors", "[unit][net]") {
  const std::vector<uint8_t> wire = Encode({Bytes("header"), Bytes("payload")});
  std::vector<std::vector<uint8_t>> frames;
  for (size_t cut = 0; cut < wire.size(); cut++) {
    const Status st = DecodeStreamMessage({wire.data(), cut}, {}, &frames);
    INFO("cut at " << cut);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains("truncated"));
  }
  // Not the protocol: a ZMTP greeting, text, a wrong version.
  std::vector<uint8_t> zmtp = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0};
  Status st = DecodeStreamMessage(zmtp, {}, &frames);
  CHECK_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kError);
  CHECK_FALSE(DecodeStreamMessage(Bytes("GET / HTTP/1.1\r\n\r\n"), {}, &frames).ok());
  std::vector<uint8_t> v2 = wire;
  v2[3] = 2;
  CHECK_FALSE(DecodeStreamMessage(v2, {}, &frames).ok());

  // Random bytes never crash, never complete a message bigger than the cap, never hold more.
  std::mt19937_64 rng(44);
  StreamFrameLimits limits;
  limits.max_message_bytes = 4096;
  for (int i = 0; i < 20000; i++) {
    std::vector<uint8_t> junk = wire;
    if (i % 2) junk.assign(rng() % 64, 0);
    for (size_t k = 0, n = 1 + rng() % 6; k < n && !junk.empty(); k++) junk[rng() % junk.size()] = (uint8_t)rng();
    StreamDecoder d(limits);
    size_t taken = 0;
    if (d.Feed(junk, &taken).ok()) {
      CHECK(taken <= junk.size());
      CHECK(d.buffered_bytes() <= limits.max_message_bytes);
      if (d.complete()) CHECK(d.announced_bytes() <= limits.max_message_bytes);
    } else {
      CHECK(d.failed());
    }
  }
}

}  // namespace
}  // namespace diloco::net
