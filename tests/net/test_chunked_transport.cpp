// The chunked form of wire messages (chunk_frame.h, chunk_assembler.h): a delta published one
// ZeroMQ message per chunk is reassembled and verified over real tcp and ipc sockets, and every
// kind of bad chunk stream (missing, repeated, reordered, corrupted, interleaved with another
// message, over the limits, a sender gone mid-message) is dropped whole with a counted reason.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "daemon/net/channel.h"
#include "daemon/net/chunk_assembler.h"
#include "daemon/net/context.h"
#include "daemon/net/wire_transport.h"
#include "daemon/util/crc32c.h"
#include "tests/net/transport_test_util.h"

namespace diloco::net {
namespace {

using testing::CopyFrames;
using testing::LogCapture;
using testing::MakeContext;
using testing::Plain;
using testing::WaitFor;

constexpr uint64_t kModelParams = 4 << 20;

ParseOptions Expect() {
  ParseOptions p;
  p.job_id = "job-1";
  p.model_params = kModelParams;
  p.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat);
  return p;
}

// A delta of n fp32 values from `sender` (default 9 MiB: three chunks, the last 1 MiB).
struct Delta {
  std::shared_ptr<std::vector<uint8_t>> payload;
  OutgoingMessage out;
  Delta(const std::string& sender, uint64_t seq, size_t n = (9u << 20) / 4, bool defer_crc = false)
      : payload(std::make_shared<std::vector<uint8_t>>(4 * n)) {
    for (size_t i = 0; i < payload->size(); ++i) (*payload)[i] = static_cast<uint8_t>(i * 13 + seq);
    EnvelopeHeader h;
    h.job_id = "job-1";
    h.sender = sender;
    h.seq = seq;
    h.incarnation = 42;
    DeltaMsg d;
    d.fragment = 0;
    d.base_version = 1;
    d.c_steps = 10;
    d.c_tokens = 1000;
    d.payload.codec = CodecKind::kFp32;
    d.payload.tensors = {{"w", 0, n, 4 * n}};
    REQUIRE(BuildMessage(h, d, *payload, &out, BuildOptions{.defer_payload_crc = defer_crc}).ok());
  }
  Message ToWire() {
    OutgoingMessage copy = out;
    return ToMessage(std::move(copy), payload);
  }
  // The chunked form as PubChannel sends it, without the topic: chunks 0..n-1, then the seal.
  std::vector<Message> Parts() const {
    std::vector<Message> parts;
    ChunkFrame f;
    f.sender = out.sender;
    f.incarnation = out.incarnation;
    f.seq = out.seq;
    f.count = static_cast<uint32_t>(out.chunks.size());
    for (const auto& c : out.chunks) f.payload_bytes += c.size();
    for (uint32_t k = 0; k <= f.count; ++k) {
      f.kind = k < f.count ? ChunkKind::kChunk : ChunkKind::kSeal;
      f.index = k;
      f.crc32c = k < f.count ? out.chunk_crc32c[k] : 0;
      Message m;
      const std::vector<uint8_t> frame = EncodeChunkFrame(f);
      m.AddCopy(frame.data(), frame.size());
      if (k < f.count) {
        m.AddCopy(out.chunks[k].data(), out.chunks[k].size());
      } else {
        m.AddCopy(out.header.data(), out.header.size());
      }
      parts.push_back(std::move(m));
    }
    return parts;
  }
};

// The same message under another chunk frame (decoded, changed by edit, encoded again).
Message Reframed(const Message& m, const std::function<void(ChunkFrame*)>& edit) {
  ChunkFrame f;
  REQUIRE(DecodeChunkFrame(m.frame(0), &f).ok());
  edit(&f);
  const std::vector<uint8_t> frame = EncodeChunkFrame(f);
  Message out;
  out.AddCopy(frame.data(), frame.size());
  out.AddCopy(m.frame(1).data(), m.frame(1).size());
  return out;
}

struct Live {
  std::unique_ptr<NetContext> ctx = MakeContext();
  std::shared_ptr<ParsedMessage> parsed = std::make_shared<ParsedMessage>();
  std::unique_ptr<SubChannel> sub;
  std::unique_ptr<PubChannel> pub;
  std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();

  Live(const std::string& endpoint, ReceiveOptions ro = {}) {
    ro.validator = EnvelopeValidatorInPlace(Expect(), parsed);
    ro.clock = [this] { return now; };
    REQUIRE(SubChannel::Create(*ctx, Plain("syncer.uplink"), ro, &sub).ok());
    REQUIRE(sub->Bind(endpoint).ok());
    REQUIRE(sub->Subscribe("job-1").ok());
    REQUIRE(PubChannel::Create(*ctx, Plain("learner"), &pub).ok());
    REQUIRE(pub->Connect(sub->endpoint()).ok());
    // Join: heartbeats until one arrives (PUB/SUB slow joiner).
    uint64_t seq = 0;
    REQUIRE(WaitFor([&] {
      OutgoingMessage out;
      EnvelopeHeader h;
      h.job_id = "job-1";
      h.sender = "prober";
      h.seq = ++seq;
      REQUIRE(BuildMessage(h, HeartbeatMsg{}, {}, &out).ok());
      Message m = ToMessage(std::move(out), nullptr);
      pub->Publish("job-1", m);
      Received r;
      return sub->Receive(&r, 10) == RecvResult::kMessage;
    }));
    Received r;
    while (sub->Receive(&r, 20) == RecvResult::kMessage) {
    }
  }
  void Send(Message m) { REQUIRE(pub->Publish("job-1", m) == SendResult::kSent); }
  // Receives for up to timeout_ms; true when a delta came.
  bool Got(int timeout_ms = 3000) {
    Received r;
    return sub->Receive(&r, timeout_ms) == RecvResult::kMessage && parsed->type() == MessageType::kDelta;
  }
};

std::string TempIpc() {
  static int n = 0;
  const auto dir = std::filesystem::temp_directory_path() / ("dl_chunks_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return "ipc://" + (dir / ("s" + std::to_string(n++))).string();
}

TEST_CASE("Chunked delta is reassembled and verified over tcp and ipc", "[net][wire]") {
  const bool ipc = GENERATE(false, true);
  // Deferred: the sender computes the payload CRC while it sends the chunks.
  const bool defer_crc = GENERATE(false, true);
  INFO((ipc ? "ipc" : "tcp") << (defer_crc ? " deferred CRC" : ""));
  Live live(ipc ? TempIpc() : "tcp://127.0.0.1:*");
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    Delta d("learner-0", seq, (9u << 20) / 4, defer_crc);
    Message m = d.ToWire();
    REQUIRE(m.chunk_info() != nullptr);  // sent in the chunked form
    live.Send(std::move(m));
    REQUIRE(live.Got());
    const ParsedMessage& p = *live.parsed;
    CHECK(p.header.seq == seq);
    REQUIRE(p.payload_chunks.size() == 3);
    CHECK(p.payload_size() == d.payload->size());
    auto copy = p;
    copy.MakeContiguous();
    CHECK(std::equal(copy.payload.begin(), copy.payload.end(), d.payload->begin()));
  }
  // The multipart form still works on the same socket.
  Delta d("learner-0", 4);
  OutgoingMessage out = d.out;
  out.chunk_crc32c.clear();
  Message whole = ToMessage(std::move(out), d.payload);
  CHECK(whole.chunk_info() == nullptr);
  live.Send(std::move(whole));
  CHECK(live.Got());
  CHECK(live.sub->stats().rejected == 0);
  CHECK(live.sub->stats().received >= 4);
}

TEST_CASE("Chunked deltas from two senders interleave and both arrive", "[net][wire]") {
  Live live("tcp://127.0.0.1:*");
  Delta a("learner-0", 1), b("learner-1", 1);
  auto pa = a.Parts(), pb = b.Parts();
  for (size_t i = 0; i < pa.size(); ++i) {
    live.Send(std::move(pa[i]));
    live.Send(std::move(pb[i]));
  }
  CHECK(live.Got());
  CHECK(live.Got());
  CHECK(live.sub->stats().rejected == 0);
}

// One bad chunk stream per case: parts of delta seq 1 changed, sent, then a good delta seq 2 that
// must arrive while seq 1 never does.
TEST_CASE("Bad chunk streams are dropped whole with a reason", "[net][wire]") {
  struct Case {
    const char* name;
    const char* reason;
    uint64_t rejects;  // messages (and stray pieces) dropped
    std::function<std::vector<Message>(std::vector<Message>)> mangle;
  };
  const std::vector<Case> cases = {
      {"missing chunk", "missing or reordered", 1,
       [](std::vector<Message> p) {
         p.erase(p.begin() + 1);
         return p;
       }},
      {"duplicated chunk", "repeated", 1,
       [](std::vector<Message> p) {
         p.insert(p.begin() + 2, CopyFrames(p[1]));
         return p;
       }},
      {"reordered chunks", "missing or reordered", 1,
       [](std::vector<Message> p) {
         std::swap(p[1], p[2]);
         return p;
       }},
      {"chunk CRC wrong", "CRC32C mismatch", 1,
       [](std::vector<Message> p) {
         std::vector<uint8_t> data(p[1].frame(1).begin(), p[1].frame(1).end());
         data[12345] ^= 0x04;
         Message m;
         m.AddCopy(p[1].frame(0).data(), p[1].frame(0).size());
         m.AddCopy(data.data(), data.size());
         p[1] = std::move(m);
         return p;
       }},
      // seq 1 and seq 7 each dropped when the other's chunk came, then seq 1's stray chunk 1.
      {"chunk of another message interleaved", "arrived before its seal", 3,
       [](std::vector<Message> p) {
         Delta other("learner-0", 7);
         p.insert(p.begin() + 1, std::move(other.Parts()[0]));
         return p;
       }},
      {"seal without chunks", "without its chunks", 1,
       [](std::vector<Message> p) {
         std::vector<Message> q;
         q.push_back(std::move(p.back()));
         return q;
       }},
      {"sealed early", "sealed after 2 of 3 chunks", 1,
       [](std::vector<Message> p) {
         p.erase(p.begin() + 2);
         return p;
       }},
      // Whole and consistent, but the chunk frames name another message than the envelope.
      {"chunks of another seq under this envelope", "sealed by the envelope of seq 1",
       1,
       [](std::vector<Message> p) {
         for (Message& m : p) m = Reframed(m, [](ChunkFrame* f) { f->seq = 5; });
         return p;
       }},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      LogCapture logs;
      Live live("tcp://127.0.0.1:*");
      Delta bad("learner-0", 1);
      for (Message& m : c.mangle(bad.Parts())) live.Send(std::move(m));
      Delta good("learner-0", 2);
      live.Send(good.ToWire());
      REQUIRE(live.Got());
      CHECK(live.parsed->header.seq == 2);
      CHECK_FALSE(live.Got(100));
      CHECK(live.sub->stats().rejected == c.rejects);
      CHECK(logs.Contains(c.reason));
    }
  }
}

TEST_CASE("Chunked message over the size limit is dropped before it is held", "[net][wire]") {
  LogCapture logs;
  ReceiveOptions ro;
  ro.max_message_bytes = 8 << 20;
  Live live("tcp://127.0.0.1:*", ro);
  Delta big("learner-0", 1);  // 9 MiB
  live.Send(big.ToWire());
  Delta small("learner-0", 2, (5u << 20) / 4);
  live.Send(small.ToWire());
  REQUIRE(live.Got());
  CHECK(live.parsed->header.seq == 2);
  CHECK(live.sub->stats().rejected == 1);
  CHECK(logs.Contains("over the limit"));
}

TEST_CASE("A sender gone mid-message: its partial message is dropped after the timeout", "[net][wire]") {
  LogCapture logs;
  ReceiveOptions ro;
  ro.chunk_timeout_ms = 1000;
  Live live("tcp://127.0.0.1:*", ro);
  Delta d("learner-0", 1);
  auto parts = d.Parts();
  live.Send(std::move(parts[0]));
  live.Send(std::move(parts[1]));
  CHECK_FALSE(live.Got(200));
  CHECK(live.sub->stats().rejected == 0);  // still waiting for the rest
  live.now += std::chrono::milliseconds(1500);
  CHECK_FALSE(live.Got(0));
  CHECK(live.sub->stats().rejected == 1);
  CHECK(logs.Contains("silent for 1500 ms"));
  // Its late seal is dropped too; a new message from it goes through.
  live.Send(std::move(parts[3]));
  Delta next("learner-0", 2);
  live.Send(next.ToWire());
  REQUIRE(live.Got());
  CHECK(live.parsed->header.seq == 2);
}

TEST_CASE("Chunk assembler holds at most max_streams messages", "[net][unit]") {
  ChunkAssemblerOptions o;
  o.max_streams = 2;
  ChunkAssembler a(o);
  const auto t = std::chrono::steady_clock::now();
  std::vector<std::string> dropped;
  for (int s = 0; s < 3; ++s) {
    Delta d("learner-" + std::to_string(s), 1);
    auto r = a.Add("job-1", std::move(d.Parts()[0]), t + std::chrono::milliseconds(s));
    dropped.insert(dropped.end(), r.dropped.begin(), r.dropped.end());
  }
  CHECK(a.streams() == 2);
  REQUIRE(dropped.size() == 1);
  CHECK_THAT(dropped[0], Catch::Contains("learner-0") && Catch::Contains("more than 2 messages"));
  CHECK(a.bytes_held() == 2 * (uint64_t{4} << 20));
}

TEST_CASE("Chunk assembler drops a message that would pass max_total_bytes", "[net][unit]") {
  ChunkAssemblerOptions o;
  o.max_total_bytes = 10 << 20;
  ChunkAssembler a(o);
  const auto t = std::chrono::steady_clock::now();
  Delta d0("learner-0", 1), d1("learner-1", 1);
  auto p0 = d0.Parts(), p1 = d1.Parts();
  for (size_t i = 0; i < 3; ++i) CHECK(a.Add("job-1", std::move(p0[i]), t).dropped.empty());
  CHECK(a.bytes_held() == uint64_t{9} << 20);
  auto r = a.Add("job-1", std::move(p1[0]), t);
  REQUIRE(r.dropped.size() == 1);
  CHECK_THAT(r.dropped[0], Catch::Contains("learner-1") && Catch::Contains("more than 10485760 bytes"));
  // learner-0 still completes; afterwards nothing is held.
  r = a.Add("job-1", std::move(p0[3]), t);
  CHECK(r.complete());
  CHECK(r.message.size() == 4);
  CHECK(a.bytes_held() == 0);
}

TEST_CASE("A deferred payload CRC completes to the header BuildMessage writes at once", "[net][unit]") {
  // 9 MiB (three chunks: chunked form) and 1 MiB (one chunk: ToMessage completes it).
  const size_t n = GENERATE(size_t{9} << 18, size_t{1} << 18);
  Delta now("learner-0", 3, n), later("learner-0", 3, n, true);
  REQUIRE(later.out.crc_pending);
  CHECK(later.out.chunk_crc32c.empty());
  CHECK(later.out.header.size() == now.out.header.size());
  std::vector<uint8_t> sealed = later.out.header;
  SealPayloadCrc32c(sealed, later.out.crc_offset, Crc32c(later.payload->data(), later.payload->size()));
  CHECK(sealed == now.out.header);
  // Any use of the frames of a message still waiting for its CRC completes it first.
  Message m = later.ToWire();
  CHECK((m.chunk_info() != nullptr) == (n > (size_t{1} << 20)));
  const std::vector<std::span<const uint8_t>> frames = m.spans();
  CHECK(std::equal(frames[0].begin(), frames[0].end(), now.out.header.begin(), now.out.header.end()));
  ParsedMessage parsed;
  CHECK(ParseEnvelope(frames, Expect(), &parsed).ok());
  if (m.chunk_info()) CHECK(m.chunk_info()->crc32c == now.out.chunk_crc32c);
}

TEST_CASE("VerifyChunks combines the chunk CRCs it is given and catches a wrong one", "[net][unit]") {
  Delta d("learner-0", 1);
  const std::vector<std::span<const uint8_t>> chunks(d.out.chunks.begin(), d.out.chunks.end());
  const uint32_t crc = Crc32c(d.payload->data(), d.payload->size());
  CHECK(VerifyChunks(chunks, d.payload->size(), crc, "delta", d.out.chunk_crc32c).ok());
  std::vector<uint32_t> wrong = d.out.chunk_crc32c;
  wrong[1] ^= 1;
  CHECK_THAT(VerifyChunks(chunks, d.payload->size(), crc, "delta", wrong).message(),
             Catch::Contains("payload CRC32C mismatch"));
  wrong.pop_back();
  CHECK_THAT(VerifyChunks(chunks, d.payload->size(), crc, "delta", wrong).message(),
             Catch::Contains("2 chunk CRCs for 3 payload frames"));
}

TEST_CASE("Chunk frame decoding rejects corruption and bad lengths", "[net][unit]") {
  ChunkFrame f;
  f.sender = "learner-0";
  f.count = 3;
  f.index = 1;
  f.payload_bytes = 9 << 20;
  std::vector<uint8_t> b = EncodeChunkFrame(f);
  ChunkFrame g;
  REQUIRE(DecodeChunkFrame(b, &g).ok());
  CHECK(g.sender == "learner-0");
  CHECK(g.index == 1);
  b[20] ^= 1;
  CHECK_THAT(DecodeChunkFrame(b, &g).message(), Catch::Contains("CRC32C mismatch"));
  b.pop_back();
  CHECK_THAT(DecodeChunkFrame(b, &g).message(), Catch::Contains("does not fit"));
}

}  // namespace
}  // namespace diloco::net
