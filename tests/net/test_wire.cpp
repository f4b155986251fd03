// Wire format: round trips of every message, framing, chunking, targeted rejections, snapshots.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "daemon/net/codec_kind.h"
#include "daemon/net/envelope.h"
#include "daemon/util/crc32c.h"
#include "tests/net/wire_samples.h"

namespace diloco {
namespace {

using wire_test::AllSamples;
using wire_test::Frames;
using wire_test::Sample;
using wire_test::SampleOptions;

OutgoingMessage Build(const Sample& s) {
  OutgoingMessage m;
  Status st = BuildMessage(s.header, s.body, s.payload, &m);
  INFO(st.message());
  REQUIRE(st.ok());
  return m;
}

Status Parse(const OutgoingMessage& m, const ParseOptions& o, ParsedMessage* out) {
  auto frames = Frames(m);
  return ParseEnvelope(frames, o, out);
}

// Parses and expects an error that contains `needle`.
void ExpectReject(const OutgoingMessage& m, const ParseOptions& o, const std::string& needle) {
  ParsedMessage p;
  Status st = Parse(m, o, &p);
  INFO("error: " << st.message() << "\nexpected: " << needle);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find(needle) != std::string::npos);
}

TEST_CASE("EncodedBytes per codec", "[net][unit]") {
  CHECK(EncodedBytes(CodecKind::kFp32, 10, 64) == 40);
  CHECK(EncodedBytes(CodecKind::kBf16, 10, 64) == 20);
  CHECK(EncodedBytes(CodecKind::kInt8, 64, 64) == 64 + 4);
  CHECK(EncodedBytes(CodecKind::kInt8, 65, 64) == 65 + 8);
  CHECK(EncodedBytes(CodecKind::kInt4, 64, 64) == 32 + 4);
  CHECK(EncodedBytes(CodecKind::kInt4, 65, 64) == 33 + 8);
  CHECK(EncodedBytes(CodecKind::kInt4, 1, 256) == 1 + 4);
  CHECK(EncodedBytes(CodecKind::kInt8, 10, 0) == 0);
  CodecKind k{};
  CHECK(ParseCodecKind("int4", &k));
  CHECK(k == CodecKind::kInt4);
  CHECK_FALSE(ParseCodecKind("int3", &k));
  CHECK(CodecName(CodecKind::kBf16) == "bf16");
}

TEST_CASE("every message type round-trips", "[net][unit]") {
  std::mt19937_64 rng(1);
  for (const Sample& s : AllSamples(rng)) {
    INFO(MessageTypeName(TypeOf(s.body)) << " from " << s.header.sender);
    OutgoingMessage m = Build(s);
    CHECK(m.chunks.size() == (s.payload.empty() ? 0u : 1u));
    CHECK(m.wire_bytes() == m.header.size() + s.payload.size());
    ParsedMessage p;
    Status st = Parse(m, SampleOptions(), &p);
    INFO(st.message());
    REQUIRE(st.ok());
    CHECK(p.header == s.header);
    CHECK(p.body == s.body);
    CHECK(p.type() == TypeOf(s.body));
    CHECK(p.wire_bytes == m.wire_bytes());
    REQUIRE(p.payload.size() == s.payload.size());
    CHECK(std::equal(p.payload.begin(), p.payload.end(), s.payload.begin()));
    if (const PayloadInfo* info = p.payload_info()) {
      CHECK(p.payload_crc32c == Crc32c(s.payload.data(), s.payload.size()));
      uint64_t pos = 0;
      for (size_t i = 0; i < info->tensors.size(); ++i) {
        auto bytes = p.tensor_bytes(i);
        CHECK(bytes.size() == info->tensors[i].encoded_bytes);
        CHECK(bytes.data() == p.payload.data() + pos);
        pos += bytes.size();
      }
      CHECK(p.tensor_bytes(info->tensors.size()).empty());
    }
  }
}

TEST_CASE("one ParsedMessage can be reused across messages", "[net][unit]") {
  std::mt19937_64 rng(2);
  auto samples = AllSamples(rng);
  ParsedMessage p;
  for (int round = 0; round < 2; ++round) {
    for (const Sample& s : samples) {
      OutgoingMessage m = Build(s);
      REQUIRE(Parse(m, SampleOptions(), &p).ok());
      CHECK(p.body == s.body);
      CHECK(p.payload.size() == s.payload.size());
    }
  }
}

TEST_CASE("a payload over 4 MiB travels in 4 MiB chunks and is reassembled", "[net][unit]") {
  std::mt19937_64 rng(3);
  const uint64_t numel = (9u << 20) / 4 + 123;  // 9 MiB + 492 bytes of fp32
  Sample s{wire_test::Header("learner-0", 5), {}, {}};
  DeltaMsg d;
  d.fragment = 0;
  d.c_steps = 3;
  d.c_tokens = 300;
  d.payload = wire_test::Dense(CodecKind::kFp32, 64, {{0, numel / 2}, {numel / 2, numel - numel / 2}});
  s.body = d;
  s.payload = wire_test::RandomBytes(rng, numel * 4);
  OutgoingMessage m = Build(s);
  REQUIRE(m.chunks.size() == 3);
  CHECK(m.chunks[0].size() == kChunkBytes);
  CHECK(m.chunks[1].size() == kChunkBytes);
  CHECK(m.chunks[2].size() == numel * 4 - 2 * kChunkBytes);
  CHECK(m.chunks[0].data() == s.payload.data());  // views, no copy on the send side
  ParseOptions o = SampleOptions();
  o.model_params = numel;
  ParsedMessage p;
  REQUIRE(Parse(m, o, &p).ok());
  REQUIRE(p.payload.size() == s.payload.size());
  CHECK(std::memcmp(p.payload.data(), s.payload.data(), s.payload.size()) == 0);
  CHECK(p.tensor_bytes(1).size() == (numel - numel / 2) * 4);

  // A missing, an extra, a reordered or a re-cut chunk is refused.
  auto frames = Frames(m);
  auto without_last = frames;
  without_last.pop_back();
  Status st = ParseEnvelope(without_last, o, &p);
  CHECK_FALSE(st.ok());
  CHECK(st.message().find("declares 3 payload frames, got 2") != std::string::npos);
  auto swapped = frames;
  std::swap(swapped[1], swapped[2]);
  CHECK_FALSE(ParseEnvelope(swapped, o, &p).ok());
  auto recut = frames;  // same bytes, cut differently: 4 MiB - 1 then 4 MiB + 1
  recut[1] = frames[1].subspan(0, kChunkBytes - 1);
  std::vector<uint8_t> joined(frames[1].end() - 1, frames[1].end());
  joined.insert(joined.end(), frames[2].begin(), frames[2].end());
  recut[2] = joined;
  st = ParseEnvelope(recut, o, &p);
  CHECK_FALSE(st.ok());
  CHECK(st.message().find("payload frame 1 of 3 has 4194303 bytes") != std::string::npos);
}

TEST_CASE("in place, the payload stays in the received chunks and is verified there", "[net][unit]") {
  std::mt19937_64 rng(5);
  const uint64_t numel = (9u << 20) / 4 + 123;  // 3 chunks
  const uint64_t first = (4u << 20) / 4 - 10;   // tensor 0 ends 40 bytes before chunk 1
  Sample s{wire_test::Header("learner-0", 6), {}, {}};
  DeltaMsg d;
  d.fragment = 0;
  d.c_steps = 3;
  d.c_tokens = 300;
  d.payload = wire_test::Dense(CodecKind::kFp32, 64, {{0, first}, {first, numel - first}});
  s.body = d;
  s.payload = wire_test::RandomBytes(rng, numel * 4);
  OutgoingMessage m = Build(s);
  REQUIRE(m.chunks.size() == 3);
  ParseOptions o = SampleOptions();
  o.model_params = numel;
  auto frames = Frames(m);
  auto owner = std::make_shared<int>(7);
  ParsedMessage p;
  Status st = ParseEnvelopeInPlace(frames, o, owner, &p);
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(p.body == s.body);
  CHECK(p.payload.empty());
  CHECK(p.payload_size() == s.payload.size());
  CHECK(p.payload_crc32c == Crc32c(s.payload.data(), s.payload.size()));
  CHECK(p.payload_owner == owner);
  REQUIRE(p.payload_chunks.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(p.payload_chunks[i].data() == frames[i + 1].data());  // no copy
  CHECK(p.payload_spans().size() == 3);
  // Tensor 0 lies in chunk 0: a view; tensor 1 spans chunks 0..2: empty until contiguous.
  CHECK(p.tensor_bytes(0).data() == frames[1].data());
  CHECK(p.tensor_bytes(0).size() == first * 4);
  CHECK(p.tensor_bytes(1).empty());
  p.MakeContiguous();
  CHECK(p.payload_chunks.empty());
  CHECK(p.payload_owner == nullptr);
  REQUIRE(p.payload.size() == s.payload.size());
  CHECK(std::memcmp(p.payload.data(), s.payload.data(), s.payload.size()) == 0);
  CHECK(p.tensor_bytes(1).size() == (numel - first) * 4);
  CHECK(p.payload_spans().size() == 1);

  // A flipped bit in any chunk (the CRC is computed last chunk first and combined) and a short
  // chunk are refused, with the messages ParseEnvelope gives.
  for (size_t c = 1; c <= 3; ++c) {
    std::vector<uint8_t> bad(frames[c].begin(), frames[c].end());
    bad[bad.size() / 2] ^= 0x10;
    auto f = frames;
    f[c] = bad;
    ParsedMessage q;
    st = ParseEnvelopeInPlace(f, o, nullptr, &q);
    CHECK_FALSE(st.ok());
    CHECK(st.message().find("payload CRC32C mismatch") != std::string::npos);
    CHECK(st.message() == ParseEnvelope(f, o, &q).message());
  }
  auto short_chunk = frames;
  short_chunk[2] = frames[2].subspan(1);
  st = ParseEnvelopeInPlace(short_chunk, o, nullptr, &p);
  CHECK(st.message().find("payload frame 2 of 3 has 4194303 bytes") != std::string::npos);
  CHECK(VerifyChunks(std::span(frames).subspan(1), s.payload.size(), p.payload_crc32c + 1, "x").message().find(
            "CRC32C mismatch") != std::string::npos);

  // A message without payload: nothing kept.
  OutgoingMessage hb = Build({wire_test::Header("learner-0", 7), HeartbeatMsg{}, {}});
  auto hf = Frames(hb);
  REQUIRE(ParseEnvelopeInPlace(hf, o, owner, &p).ok());
  CHECK(p.payload_size() == 0);
  CHECK(p.payload_owner == nullptr);
  CHECK(p.payload_spans().empty());
}

TEST_CASE("a header that is not 8-byte aligned in memory parses", "[net][unit]") {
  std::mt19937_64 rng(4);
  for (const Sample& s : AllSamples(rng)) {
    OutgoingMessage m = Build(s);
    std::vector<uint8_t> shifted(m.header.size() + 3);
    std::memcpy(shifted.data() + 3, m.header.data(), m.header.size());
    auto frames = Frames(m);
    frames[0] = std::span<const uint8_t>(shifted.data() + 3, m.header.size());
    ParsedMessage p;
    REQUIRE(ParseEnvelope(frames, SampleOptions(), &p).ok());
    CHECK(p.body == s.body);
  }
}

TEST_CASE("envelope checks: version, job, sender, accepted types", "[net][unit]") {
  std::mt19937_64 rng(5);
  Sample s = AllSamples(rng)[3];  // heartbeat from learner-1
  REQUIRE(TypeOf(s.body) == MessageType::kHeartbeat);
  OutgoingMessage m = Build(s);

  ParseOptions o = SampleOptions();
  o.job_id = "job-8";
  ExpectReject(m, o, "heartbeat from learner-1: job id \"job-7\" is not this job (\"job-8\")");
  o = SampleOptions();
  o.any_job = true;
  o.job_id = "";
  ParsedMessage p;
  CHECK(Parse(m, o, &p).ok());

  o = SampleOptions();
  o.allowed_senders = {"learner-0", "learner-2"};
  ExpectReject(m, o, "heartbeat from learner-1: sender is not in the allowlist");
  o.allowed_senders.push_back("learner-1");
  CHECK(Parse(m, o, &p).ok());

  o = SampleOptions();
  o.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kGlobal);
  ExpectReject(m, o, "does not accept heartbeat messages");

  Sample v2 = s;
  v2.header.protocol_version = 2;
  OutgoingMessage m2;
  REQUIRE(BuildMessage(v2.header, v2.body, {}, &m2).ok());
  ExpectReject(m2, SampleOptions(), "protocol version 2 is not supported");
  o = SampleOptions();
  o.max_protocol_version = 2;
  CHECK(Parse(m2, o, &p).ok());

  // Messages without payload take exactly one frame.
  auto frames = Frames(m);
  std::vector<uint8_t> junk(10, 1);
  frames.push_back(junk);
  Status st = ParseEnvelope(frames, SampleOptions(), &p);
  CHECK(st.message().find("1 unexpected payload frames") != std::string::npos);
  CHECK_FALSE(ParseEnvelope(std::span<const std::span<const uint8_t>>(), SampleOptions(), &p).ok());
}

TEST_CASE("header integrity: CRC trailer, identifier, verifier, union type", "[net][unit]") {
  std::mt19937_64 rng(6);
  Sample s = AllSamples(rng)[5];  // int4 delta
  REQUIRE(TypeOf(s.body) == MessageType::kDelta);
  OutgoingMessage m = Build(s);
  ParsedMessage p;

  OutgoingMessage flipped = m;
  flipped.header[20] ^= 0x10;
  ExpectReject(flipped, SampleOptions(), "header CRC32C mismatch");

  OutgoingMessage wrong_id = m;
  wrong_id.header[4] = 'X';
  ResealHeader(&wrong_id.header);
  ExpectReject(wrong_id, SampleOptions(), "file identifier is not \"DLCD\"");

  OutgoingMessage bad_root = m;
  bad_root.header[0] = 0xf0;
  bad_root.header[1] = 0xff;
  ResealHeader(&bad_root.header);
  ExpectReject(bad_root, SampleOptions(), "FlatBuffers verification failed");

  OutgoingMessage tiny;
  tiny.header = {1, 2, 3};
  ExpectReject(tiny, SampleOptions(), "too short");

  ParseOptions small = SampleOptions();
  small.max_header_bytes = 64;
  ExpectReject(m, small, "header larger than the limit of 64 bytes");

  for (uint8_t type : {0, 11, 200}) {
    RawOverrides raw;
    raw.body_type = type;
    OutgoingMessage bad;
    BuildMessageUnchecked(s.header, s.body, s.payload, raw, &bad);
    ExpectReject(bad, SampleOptions(), type == 0 ? "body type 0 (none)" : "is unknown");
  }
  // A Delta table tagged as a Global: the Verifier or the semantic checks refuse it.
  RawOverrides confused;
  confused.body_type = static_cast<uint8_t>(MessageType::kGlobal);
  OutgoingMessage bad;
  BuildMessageUnchecked(s.header, s.body, s.payload, confused, &bad);
  CHECK_FALSE(Parse(bad, SampleOptions(), &p).ok());
}

TEST_CASE("payload semantics are checked before anything is returned", "[net][unit]") {
  std::mt19937_64 rng(7);
  const Sample base = AllSamples(rng)[6];  // int8 delta from learner-2, one tensor of 3000
  REQUIRE(TypeOf(base.body) == MessageType::kDelta);
  auto with = [&](auto edit, RawOverrides raw = {}) {
    Sample s = base;
    edit(std::get<DeltaMsg>(s.body));
    OutgoingMessage m;
    BuildMessageUnchecked(s.header, s.body, base.payload, raw, &m);  // chunks view base.payload
    return m;
  };
  const ParseOptions o = SampleOptions();

  ExpectReject(with([](DeltaMsg& d) { d.payload.tensors[0].encoded_bytes -= 100; }), o,
               "delta from learner-2: tensor 0 (t0.weight) declares 3000 int8 values (block 128) "
               "= 3096 bytes but 2996");
  ExpectReject(with([](DeltaMsg& d) { d.payload.tensors[0].offset = wire_test::kModelParams - 10; }), o,
               "outside the model's 1048576 parameters");
  ExpectReject(with([](DeltaMsg& d) { d.payload.tensors[0].offset = ~uint64_t{0} - 5; }), o,
               "outside the model's");
  ExpectReject(with([](DeltaMsg& d) { d.payload.tensors[0].numel = 0; }), o, "has no elements");
  ExpectReject(with([](DeltaMsg& d) { d.payload.tensors.clear(); }), o, "payload lists no tensors");
  ExpectReject(with([](DeltaMsg& d) {
                 d.payload.tensors = {{"a", 0, 100, 100 + 4}, {"b", 50, 100, 100 + 4}};
               }),
               o, "tensor 1 (b) starts at element 50, before the end of tensor 0 (100)");
  ExpectReject(with([](DeltaMsg& d) { d.payload.codec = static_cast<CodecKind>(9); }), o,
               "codec 9 is unknown");
  ExpectReject(with([](DeltaMsg& d) { d.payload.block_size = 63; }), o,
               "block size 63 is not an even number");
  ExpectReject(with([](DeltaMsg& d) { d.payload.topk_fraction = std::nan(""); }), o,
               "top-k fraction");
  ExpectReject(with([](DeltaMsg& d) {
                 d.payload.topk_fraction = 0.5;
                 d.payload.tensors[0].encoded_bytes = 20;
               }),
               o,
               "declares 20 bytes for top-k of 3000 int8 values; valid: 21..");
  ExpectReject(with([](DeltaMsg& d) { d.c_steps = 0; }), o, "c_steps is 0");
  ExpectReject(with([](DeltaMsg& d) { d.fragment = 64; }), o, "fragment 64 is out of range");
  ExpectReject(with([](DeltaMsg& d) { d.payload.tensors[0].name = "bad name"; }), o,
               "not printable ASCII");

  auto same = [](DeltaMsg&) {};
  RawOverrides raw;
  raw.payload_bytes = uint64_t{1} << 62;
  ExpectReject(with(same, raw), o, "declares 4611686018427387904 payload bytes");
  raw = {};
  raw.payload_crc32c = 12345;
  ExpectReject(with(same, raw), o, "payload CRC32C mismatch");
  raw = {};
  raw.num_chunks = 1u << 30;
  ExpectReject(with(same, raw), o, "declares 1073741824 payload frames, got 1");
  raw = {};
  raw.num_chunks = 2;
  raw.chunk_bytes = 2000;
  ExpectReject(with(same, raw), o, "2 payload frames for 3096 bytes (want 1");

  ParseOptions no_model = o;
  no_model.model_params = 0;
  ExpectReject(with(same), no_model, "no model is configured");
  ParseOptions small_model = o;
  small_model.model_params = 2999;
  ExpectReject(with(same), small_model, "outside the model's 2999 parameters");
  ParseOptions small_payload = o;
  small_payload.max_payload_bytes = 3000;
  ExpectReject(with(same), small_payload, "exceeds the limit of 3000");
  ParseOptions few_tensors = SampleOptions();
  few_tensors.max_tensors = 2;
  std::mt19937_64 rng2(7);
  ExpectReject(Build(AllSamples(rng2)[5]), few_tensors, "tensor list has 3 entries, more than 2");

  // A corrupted payload byte.
  OutgoingMessage m = with(same);
  std::vector<uint8_t> chunk(m.chunks[0].begin(), m.chunks[0].end());
  chunk[1234] ^= 1;
  m.chunks[0] = chunk;
  ExpectReject(m, o, "delta from learner-2: payload CRC32C mismatch");
}

TEST_CASE("body semantics per message type", "[net][unit]") {
  std::mt19937_64 rng(8);
  auto samples = AllSamples(rng);
  auto find = [&](MessageType t) {
    for (const auto& s : samples) {
      if (TypeOf(s.body) == t) return s;
    }
    FAIL("no sample");
    return samples[0];
  };
  auto reject = [&](Sample s, const std::string& needle) {
    OutgoingMessage m;
    BuildMessageUnchecked(s.header, s.body, s.payload, {}, &m);
    ExpectReject(m, SampleOptions(), needle);
    // The sender-side checks refuse it too.
    OutgoingMessage again;
    CHECK_FALSE(BuildMessage(s.header, s.body, s.payload, &again).ok());
  };
  {
    Sample s = find(MessageType::kGlobal);
    std::get<GlobalMsg>(s.body).base_version = 3;
    reject(s, "an update to version 8 on top of version 3 (must be 7)");
    std::get<GlobalMsg>(s.body).version = 0;
    reject(s, "version 0");
    s = find(MessageType::kGlobal);
    std::get<GlobalMsg>(s.body).contributors[1].weight = -1;
    reject(s, "contributor 1 weight");
    s = find(MessageType::kSyncerStatus);
    std::get<SyncerStatusMsg>(s.body).live_steps.push_back(5);
    reject(s, "3 live steps for 2 live learners");
  }
  {
    Sample s = find(MessageType::kSnapshot);
    std::get<SnapshotMsg>(s.body).fragment_crc32c ^= 1;
    reject(s, "fragment CRC32C");
    s = find(MessageType::kSnapshot);
    std::get<SnapshotMsg>(s.body).version = 6;
    reject(s, "fragment 2 at version 6 but the cut says 7");
    s = find(MessageType::kSnapshot);
    std::get<SnapshotMsg>(s.body).part = 3;
    reject(s, "part 3 of 3");
  }
  {
    Sample s = find(MessageType::kHeartbeat);
    std::get<HeartbeatMsg>(s.body).fragments[2].fragment = 0;
    reject(s, "fragment counters lists fragment 0 twice");
    s = find(MessageType::kHeartbeat);
    std::get<HeartbeatMsg>(s.body).tokens_per_s = std::numeric_limits<float>::infinity();
    reject(s, "tokens_per_s is inf");
    s = find(MessageType::kHeartbeat);
    std::get<HeartbeatMsg>(s.body).state = static_cast<LearnerState>(0);
    reject(s, "learner state 0 is invalid");
  }
  {
    Sample s = find(MessageType::kWelcome);
    std::get<WelcomeMsg>(s.body).result = JoinResult::kBusy;
    reject(s, "refusal without a reason");
  }
  {
    Sample s = find(MessageType::kControl);
    std::get<ControlMsg>(s.body).args[0].key = "";
    reject(s, "arg 0 key is empty");
  }
  {
    Sample s = find(MessageType::kHello);
    s.header.sender = "learner 0";
    reject(s, "sender \"learner 0\" is not printable ASCII");
    s = find(MessageType::kHello);
    s.header.job_id = std::string(200, 'j');
    reject(s, "job id has 200 bytes");
  }
  {
    Sample s = find(MessageType::kJobSpec);
    std::get<JobSpecMsg>(s.body).config_yaml.clear();
    reject(s, "empty config");
  }
}

// Every enum field is checked against every value of its schema enum (0 and one past the last
// are rejected, every named value is accepted), in Hello and Welcome alike.
TEST_CASE("enum fields accept exactly the schema's values", "[net][unit]") {
  std::mt19937_64 rng(10);
  auto samples = AllSamples(rng);
  auto find = [&](MessageType t) {
    for (const auto& s : samples) {
      if (TypeOf(s.body) == t) return s;
    }
    FAIL("no sample");
    return samples[0];
  };
  // set(body, raw value); last = the schema enum's last value.
  auto sweep = [&](MessageType type, int last, const std::string& what, auto set) {
    for (int v = 0; v <= last + 1; ++v) {
      Sample s = find(type);
      set(s.body, static_cast<uint8_t>(v));
      if (type == MessageType::kWelcome && v != 1) std::get<WelcomeMsg>(s.body).reason = "no";
      INFO(what << " = " << v);
      OutgoingMessage m;
      BuildMessageUnchecked(s.header, s.body, s.payload, {}, &m);
      ParsedMessage p;
      Status st = Parse(m, SampleOptions(), &p);
      OutgoingMessage again;
      const Status built = BuildMessage(s.header, s.body, s.payload, &again);
      if (v == 0 || v == last + 1) {
        CHECK(st.message().find(what + " " + std::to_string(v) + " is invalid") != std::string::npos);
        CHECK_FALSE(built.ok());
      } else {
        INFO(st.message());
        CHECK(st.ok());
        CHECK(built.ok());
      }
    }
  };
  sweep(MessageType::kHello, 4, "role", [](MessageBody& b, uint8_t v) {
    std::get<HelloMsg>(b).role = static_cast<PeerRole>(v);
  });
  sweep(MessageType::kHello, 2, "parameter dtype", [](MessageBody& b, uint8_t v) {
    std::get<HelloMsg>(b).param_dtype = static_cast<ParamDType>(v);
  });
  sweep(MessageType::kWelcome, 2, "parameter dtype", [](MessageBody& b, uint8_t v) {
    std::get<WelcomeMsg>(b).param_dtype = static_cast<ParamDType>(v);
  });
  sweep(MessageType::kWelcome, 8, "join result", [](MessageBody& b, uint8_t v) {
    std::get<WelcomeMsg>(b).result = static_cast<JoinResult>(v);
  });
  sweep(MessageType::kHeartbeat, 6, "learner state", [](MessageBody& b, uint8_t v) {
    std::get<HeartbeatMsg>(b).state = static_cast<LearnerState>(v);
  });
  // The model shape is checked the same way in Hello and Welcome.
  for (MessageType t : {MessageType::kHello, MessageType::kWelcome}) {
    Sample s = find(t);
    if (auto* h = std::get_if<HelloMsg>(&s.body)) h->num_fragments = 65;
    if (auto* w = std::get_if<WelcomeMsg>(&s.body)) w->num_fragments = 65;
    OutgoingMessage m;
    BuildMessageUnchecked(s.header, s.body, s.payload, {}, &m);
    ExpectReject(m, SampleOptions(), "65 fragments is more than max_fragments 64");
  }
}

TEST_CASE("BuildMessage refuses a payload that does not match its descriptors", "[net][unit]") {
  std::mt19937_64 rng(9);
  Sample s = AllSamples(rng)[5];
  OutgoingMessage m;
  s.payload.pop_back();
  Status st = BuildMessage(s.header, s.body, s.payload, &m);
  CHECK_FALSE(st.ok());
  CHECK(st.message().find("building delta from learner-1: the tensors' encoded bytes sum to") !=
        std::string::npos);
  Sample h = AllSamples(rng)[0];
  CHECK_FALSE(BuildMessage(h.header, h.body, s.payload, &m).ok());
}

TEST_CASE("ReassembleChunks", "[net][unit]") {
  std::mt19937_64 rng(10);
  auto data = wire_test::RandomBytes(rng, kChunkBytes + 10);
  const uint32_t crc = Crc32c(data.data(), data.size());
  std::span<const uint8_t> all(data);
  std::vector<std::span<const uint8_t>> chunks = {all.subspan(0, kChunkBytes), all.subspan(kChunkBytes)};
  ParsedMessage::Bytes out;
  REQUIRE(ReassembleChunks(chunks, data.size(), crc, "t", &out).ok());
  CHECK(std::equal(out.begin(), out.end(), data.begin()));
  CHECK_FALSE(ReassembleChunks(chunks, data.size(), crc ^ 1, "t", &out).ok());
  CHECK_FALSE(ReassembleChunks(chunks, data.size() + 1, crc, "t", &out).ok());
  CHECK_FALSE(ReassembleChunks(chunks, ~uint64_t{0}, crc, "t", &out).ok());
  chunks.pop_back();
  CHECK_FALSE(ReassembleChunks(chunks, data.size(), crc, "t", &out).ok());
  CHECK(ReassembleChunks({}, 0, 0, "t", &out).ok());
  CHECK(out.empty());
}

// Snapshot parts from the syncer for request 99: fragment f covers [f*1000, f*1000 + 500).
std::vector<OutgoingMessage> SnapshotParts(std::mt19937_64& rng, uint64_t snapshot_id,
                                           std::vector<std::vector<uint8_t>>* payloads,
                                           uint32_t parts = 3) {
  std::vector<OutgoingMessage> out;
  for (uint32_t f = 0; f < parts; ++f) {
    SnapshotMsg s;
    s.request_id = 99;
    s.snapshot_id = snapshot_id;
    s.part = f;
    s.num_parts = parts;
    s.fragment = f;
    s.versions = std::vector<uint64_t>(parts, 4);
    s.version = 4;
    s.payload = wire_test::Dense(CodecKind::kFp32, 64, {{f * 1000, 500}});
    payloads->push_back(wire_test::RandomBytes(rng, 2000));
    s.fragment_crc32c = Crc32c(payloads->back().data(), 2000);
    OutgoingMessage m;
    REQUIRE(BuildMessage(wire_test::Header("syncer", f), s, payloads->back(), &m).ok());
    out.push_back(std::move(m));
  }
  return out;
}

ParsedMessage ParseOk(const OutgoingMessage& m) {
  ParsedMessage p;
  Status st = Parse(m, SampleOptions(), &p);
  INFO(st.message());
  REQUIRE(st.ok());
  return p;
}

TEST_CASE("SnapshotAssembler collects the parts of one snapshot", "[net][unit]") {
  std::mt19937_64 rng(11);
  std::vector<std::vector<uint8_t>> payloads;
  auto parts = SnapshotParts(rng, 5, &payloads);
  SnapshotAssembler a(99, 1 << 20);
  REQUIRE(a.Add(ParseOk(parts[2])).ok());
  CHECK(a.versions() == std::vector<uint64_t>{4, 4, 4});
  CHECK_FALSE(a.complete());
  Status dup = a.Add(ParseOk(parts[2]));
  CHECK(dup.message().find("duplicate part") != std::string::npos);
  REQUIRE(a.Add(ParseOk(parts[0])).ok());

  // Parts of another snapshot, request, or a non-snapshot are refused; the assembler is unchanged.
  std::vector<std::vector<uint8_t>> other_payloads;
  auto other = SnapshotParts(rng, 6, &other_payloads);
  CHECK(a.Add(ParseOk(other[1])).message().find("belongs to snapshot 6, not 5") != std::string::npos);
  SnapshotAssembler b(98, 1 << 20);
  CHECK(b.Add(ParseOk(parts[1])).message().find("answers request 99, not 98") != std::string::npos);
  std::mt19937_64 rng2(1);
  CHECK_FALSE(a.Add(ParseOk(Build(AllSamples(rng2)[0]))).ok());
  CHECK(a.parts_received() == 2);

  REQUIRE(a.Add(ParseOk(parts[1])).ok());
  REQUIRE(a.complete());
  auto all = a.Take();
  REQUIRE(all.size() == 3);
  for (uint32_t i = 0; i < 3; ++i) {
    CHECK(all[i].get<SnapshotMsg>()->part == i);
    CHECK(std::equal(all[i].payload.begin(), all[i].payload.end(), payloads[i].begin()));
  }
  CHECK_FALSE(a.complete());
  CHECK(a.parts_received() == 0);
}

TEST_CASE("SnapshotAssembler refuses inconsistent parts", "[net][unit]") {
  std::mt19937_64 rng(12);
  std::vector<std::vector<uint8_t>> payloads;
  auto parts = SnapshotParts(rng, 5, &payloads);
  {
    SnapshotAssembler a(99, 3000);  // room for one part only
    REQUIRE(a.Add(ParseOk(parts[0])).ok());
    CHECK(a.Add(ParseOk(parts[1])).message().find("exceeds 3000 bytes") != std::string::npos);
  }
  {
    // A part claiming another num_parts / other versions / an overlapping range.
    SnapshotAssembler a(99, 1 << 20);
    REQUIRE(a.Add(ParseOk(parts[0])).ok());
    std::vector<std::vector<uint8_t>> p4;
    auto four = SnapshotParts(rng, 5, &p4, 4);
    CHECK(a.Add(ParseOk(four[1])).message().find("says 4 parts") != std::string::npos);

    SnapshotMsg s = *ParseOk(parts[1]).get<SnapshotMsg>();
    s.payload.tensors[0].offset = 200;  // overlaps fragment 0's [0, 500)
    OutgoingMessage m;
    REQUIRE(BuildMessage(wire_test::Header("syncer", 1), s, payloads[1], &m).ok());
    CHECK(a.Add(ParseOk(m)).message().find("overlaps another part's") != std::string::npos);

    s = *ParseOk(parts[1]).get<SnapshotMsg>();
    s.versions[2] = 5;
    REQUIRE(BuildMessage(wire_test::Header("syncer", 1), s, payloads[1], &m).ok());
    CHECK(a.Add(ParseOk(m)).message().find("versions differ") != std::string::npos);

    s = *ParseOk(parts[1]).get<SnapshotMsg>();
    s.fragment = 0;
    s.version = 4;
    REQUIRE(BuildMessage(wire_test::Header("syncer", 1), s, payloads[1], &m).ok());
    CHECK(a.Add(ParseOk(m)).message().find("fragment 0 already received") != std::string::npos);
    CHECK(a.parts_received() == 1);
  }
}

}  // namespace
}  // namespace diloco
