// The wire on the transport: EnvelopeValidator as a live channel's validator (garbage and
// corrupted envelopes rejected, good peers served, gaps from envelope seqs), zero-copy frames,
// and a smoke run of the transport benchmark.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <random>

#include "daemon/net/channel.h"
#include "daemon/net/context.h"
#include "daemon/net/transport_bench.h"
#include "daemon/net/wire_transport.h"
#include "tests/net/transport_test_util.h"

namespace diloco::net {
namespace {

using testing::CopyFrames;
using testing::LogCapture;
using testing::MakeContext;
using testing::Plain;
using testing::WaitFor;

constexpr uint64_t kModelParams = 2 << 20;

ParseOptions Expect() {
  ParseOptions p;
  p.job_id = "job-1";
  p.model_params = kModelParams;
  p.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat) |
             MessageBit(MessageType::kSnapshotRequest);
  return p;
}

EnvelopeHeader Header(const std::string& sender, uint64_t seq) {
  EnvelopeHeader h;
  h.job_id = "job-1";
  h.sender = sender;
  h.seq = seq;
  h.incarnation = 42;
  return h;
}

// A Delta of n fp32 values (5 MiB: two payload frames).
struct DeltaFactory {
  std::shared_ptr<std::vector<uint8_t>> payload;
  DeltaMsg delta;
  explicit DeltaFactory(size_t n = (5u << 20) / 4) : payload(std::make_shared<std::vector<uint8_t>>(4 * n)) {
    for (size_t i = 0; i < payload->size(); ++i) (*payload)[i] = static_cast<uint8_t>(i * 7);
    delta.fragment = 0;
    delta.base_version = 1;
    delta.c_steps = 10;
    delta.c_tokens = 1000;
    delta.payload.codec = CodecKind::kFp32;
    delta.payload.tensors = {{"w", 0, n, 4 * n}};
  }
  Message Make(const std::string& sender, uint64_t seq) {
    OutgoingMessage out;
    REQUIRE(BuildMessage(Header(sender, seq), delta, *payload, &out).ok());
    return ToMessage(std::move(out), payload);
  }
};

Message Heartbeat(const std::string& sender, uint64_t seq) {
  OutgoingMessage out;
  HeartbeatMsg hb;
  hb.step = seq;
  REQUIRE(BuildMessage(Header(sender, seq), hb, {}, &out).ok());
  return ToMessage(std::move(out), nullptr);
}

// Garbage of several kinds: random frames, a valid envelope with a flipped bit (header or payload),
// a truncated header, a missing chunk, another job, a type this socket does not accept.
Message Corrupt(const Message& good, std::mt19937& rng, int kind) {
  Message m;
  switch (kind % 6) {
    case 0: {
      const int frames = 1 + rng() % 3;
      for (int f = 0; f < frames; ++f) {
        std::string s(rng() % 200, '\0');
        for (auto& c : s) c = static_cast<char>(rng());
        m.AddCopy(s);
      }
      return m;
    }
    case 1: {  // one bit flipped anywhere in the header
      m = CopyFrames(good);
      std::vector<uint8_t> h(m.frame(0).begin(), m.frame(0).end());
      h[rng() % h.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      Message out;
      out.AddCopy(h.data(), h.size());
      for (size_t i = 1; i < m.size(); ++i) out.AddCopy(m.frame(i).data(), m.frame(i).size());
      return out;
    }
    case 2: {  // one bit flipped in the payload: the CRC catches it
      Message out;
      out.AddCopy(good.frame(0).data(), good.frame(0).size());
      for (size_t i = 1; i < good.size(); ++i) {
        std::vector<uint8_t> f(good.frame(i).begin(), good.frame(i).end());
        if (i == 1) f[rng() % f.size()] ^= 0x10;
        out.AddCopy(f.data(), f.size());
      }
      return out;
    }
    case 3: {  // truncated header
      m.AddCopy(good.frame(0).data(), good.frame(0).size() / 2);
      return m;
    }
    case 4: {  // a missing chunk
      for (size_t i = 0; i + 1 < good.size(); ++i) m.AddCopy(good.frame(i).data(), good.frame(i).size());
      return m;
    }
    default: {  // a valid envelope for another job
      OutgoingMessage out;
      EnvelopeHeader h = Header("learner-0", 1);
      h.job_id = "job-2";
      REQUIRE(BuildMessage(h, HeartbeatMsg{}, {}, &out).ok());
      return ToMessage(std::move(out), nullptr);
    }
  }
}

TEST_CASE("Envelope validator on a live SUB: corrupted envelopes rejected, good deltas served", "[net][wire]") {
  LogCapture logs;
  auto ctx = MakeContext();
  auto parsed = std::make_shared<ParsedMessage>();
  ReceiveOptions ro;
  // In place: the payload stays in the received frames (shared with the Received).
  const bool in_place = GENERATE(false, true);
  INFO((in_place ? "EnvelopeValidatorInPlace" : "EnvelopeValidator"));
  ro.validator = in_place ? EnvelopeValidatorInPlace(Expect(), parsed) : EnvelopeValidator(Expect(), parsed);
  std::unique_ptr<SubChannel> sub;
  REQUIRE(SubChannel::Create(*ctx, Plain("syncer.uplink"), ro, &sub).ok());
  REQUIRE(sub->Bind("tcp://127.0.0.1:*").ok());
  REQUIRE(sub->Subscribe("job-1").ok());
  std::unique_ptr<PubChannel> good, evil;
  REQUIRE(PubChannel::Create(*ctx, Plain("learner-0"), &good).ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("evil"), &evil).ok());
  REQUIRE(good->Connect(sub->endpoint()).ok());
  REQUIRE(evil->Connect(sub->endpoint()).ok());
  uint64_t good_seq = 0, evil_seq = 0;
  // Join: heartbeats until one arrives (PUB/SUB slow joiner), from both publishers.
  for (PubChannel* p : {good.get(), evil.get()}) {
    REQUIRE(WaitFor([&] {
      Message hb = p == good.get() ? Heartbeat("learner-0", ++good_seq) : Heartbeat("learner-9", ++evil_seq);
      p->Publish("job-1", hb);
      Received r;
      return sub->Receive(&r, 10) == RecvResult::kMessage;
    }));
  }
  Received drain;
  while (sub->Receive(&drain, 20) == RecvResult::kMessage) {
  }
  const uint64_t rejected_before = sub->stats().rejected;

  DeltaFactory deltas;
  const Message pattern = deltas.Make("learner-0", 1);
  std::mt19937 rng(5);
  const int kBad = 60;
  int good_got = 0;
  uint64_t gap_seq = 0;
  for (int i = 0; i < kBad; ++i) {
    Message bad = Corrupt(pattern, rng, i);
    REQUIRE(evil->Publish("job-1", bad) == SendResult::kSent);
    if (i % 6 == 0) {
      Message d = deltas.Make("learner-0", ++good_seq);
      if (i == 30) d = deltas.Make("learner-0", gap_seq = (good_seq += 3));  // three deltas lost on the way
      REQUIRE(good->Publish("job-1", d) == SendResult::kSent);
    }
    Received r;
    while (sub->Receive(&r, 0) == RecvResult::kMessage) {
      REQUIRE(parsed->type() == MessageType::kDelta);
      CHECK(parsed->header.sender == "learner-0");
      if (r.meta.seq == gap_seq) CHECK(r.seq.missed == 3);
      CHECK(parsed->payload_size() == deltas.payload->size());
      if (in_place) {
        CHECK(parsed->payload.empty());
        REQUIRE(parsed->payload_chunks.size() == 2);
        CHECK(parsed->payload_chunks[0].data() == r.message.frame(1).data());  // not copied
        r = Received();  // the chunks outlive the Received
        parsed->MakeContiguous();
      }
      CHECK(std::equal(parsed->payload.begin(), parsed->payload.end(), deltas.payload->begin()));
      ++good_got;
    }
  }
  Received r;
  while (good_got < 10 && sub->Receive(&r, 3000) == RecvResult::kMessage) ++good_got;
  CHECK(good_got == 10);
  CHECK(WaitFor([&] {
    Received x;
    (void)sub->Receive(&x, 0);
    return sub->stats().rejected - rejected_before == static_cast<uint64_t>(kBad);
  }));
  CHECK(sub->stats().missed == 3);
  CHECK(logs.Contains("syncer.uplink: rejected message"));
  CHECK(logs.Contains("CRC32C"));
}

TEST_CASE("Envelope validator on a live ROUTER: garbage rejected, snapshot requests answered", "[net][wire]") {
  LogCapture logs;
  auto ctx = MakeContext();
  auto parsed = std::make_shared<ParsedMessage>();
  ReceiveOptions ro;
  ro.validator = EnvelopeValidator(Expect(), parsed);
  std::unique_ptr<RouterChannel> router;
  REQUIRE(RouterChannel::Create(*ctx, Plain("syncer.snapshot"), ro, &router).ok());
  REQUIRE(router->Bind("tcp://127.0.0.1:*").ok());
  std::unique_ptr<Socket> evil;
  REQUIRE(Socket::Create(*ctx, SocketType::kDealer, Plain("evil"), &evil).ok());
  REQUIRE(evil->Connect(router->endpoint()).ok());
  auto learner_parsed = std::make_shared<ParsedMessage>();
  ReceiveOptions lro;
  ParseOptions lexpect;
  lexpect.job_id = "job-1";
  lexpect.accept = MessageBit(MessageType::kHeartbeat);
  lro.validator = EnvelopeValidator(lexpect, learner_parsed);
  SocketOptions lo = Plain("learner.snapshot");
  lo.routing_id = "learner-0";
  std::unique_ptr<DealerChannel> learner;
  REQUIRE(DealerChannel::Create(*ctx, lo, lro, &learner).ok());
  REQUIRE(learner->Connect(router->endpoint()).ok());

  DeltaFactory deltas;
  const Message pattern = deltas.Make("learner-0", 1);
  std::mt19937 rng(11);
  int answered = 0;
  for (int i = 0; i < 36; ++i) {
    Message bad = Corrupt(pattern, rng, i);
    REQUIRE(evil->Send(bad, 1000) == SendResult::kSent);
    if (i % 6 == 0) {
      OutgoingMessage out;
      SnapshotRequestMsg req;
      req.request_id = i + 1;
      req.reason = "join";
      REQUIRE(BuildMessage(Header("learner-0", i + 1), req, {}, &out).ok());
      Message m = ToMessage(std::move(out), nullptr);
      REQUIRE(learner->Send(m, 1000) == SendResult::kSent);
    }
    Received r;
    while (router->Receive(&r, 0) == RecvResult::kMessage) {
      REQUIRE(parsed->type() == MessageType::kSnapshotRequest);
      CHECK(r.peer == "learner-0");
      Message reply = Heartbeat("syncer", ++answered);  // stands in for the snapshot parts
      REQUIRE(router->SendTo(r.peer, reply) == SendResult::kSent);
    }
  }
  Received r;
  while (answered < 6 && router->Receive(&r, 3000) == RecvResult::kMessage) {
    Message reply = Heartbeat("syncer", ++answered);
    REQUIRE(router->SendTo(r.peer, reply) == SendResult::kSent);
  }
  CHECK(answered == 6);
  int replies = 0;
  while (replies < 6 && learner->Receive(&r, 3000) == RecvResult::kMessage) ++replies;
  CHECK(replies == 6);
  CHECK(WaitFor([&] {
    Received x;
    (void)router->Receive(&x, 0);
    return router->stats().rejected == 36;
  }));
  CHECK(logs.Contains("syncer.snapshot: rejected message"));
}

TEST_CASE("Transport bench runs end to end on a small payload", "[net][bench]") {
  TransportBenchOptions o;
  o.payload_bytes = 9 << 20;  // three chunks
  o.transfers = 1;
  o.warmup = 0;
  o.stream_depth = 2;
  std::vector<TransportBenchPath> paths;
  const Status st = RunTransportBench(o, &paths);
  REQUIRE(st.ok());
  REQUIRE(paths.size() == 3);
  const auto j = nlohmann::json::parse(TransportBenchJson(paths));
  for (const char* name : {"tcp", "ipc", "curve_tcp"}) {
    REQUIRE(j.contains(name));
    CHECK(j[name]["stack_GBps"].get<double>() > 0);
    CHECK(j[name]["raw_zmq_GBps"].get<double>() > 0);
    CHECK(j[name]["ratio"].get<double>() > 0);
    CHECK(j[name]["senders"].get<int>() == 1);
    CHECK(j[name]["io_threads"].get<int>() == DefaultIoThreads());
    CHECK(j[name]["aggregate_GBps"].get<double>() > 0);
  }
}

TEST_CASE("Transport bench: a stream of its default depth of 64 MiB deltas arrives whole", "[net][bench]") {
  // Its defaults stream 4 deltas of 16 chunk messages and a seal each: with a send queue of 64
  // messages PUB dropped chunks ("arrived before its seal", then "no delta received").
  TransportBenchOptions o;
  o.transfers = 1;
  o.warmup = 0;
  o.curve = false;
  REQUIRE(o.payload_bytes == uint64_t{64} << 20);
  REQUIRE(o.stream_depth == 4);
  std::vector<TransportBenchPath> paths;
  const Status st = RunTransportBench(o, &paths);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(paths.size() == 2);
  for (const TransportBenchPath& p : paths) CHECK(p.stack_stream_GBps > 0);
}

TEST_CASE("Transport bench: several senders at once into one receiving socket", "[net][bench]") {
  TransportBenchOptions o;
  o.payload_bytes = 5 << 20;  // two chunks
  o.transfers = 1;
  o.warmup = 0;
  o.stream_depth = 2;
  o.senders = 3;
  o.io_threads = 2;
  std::vector<TransportBenchPath> paths;
  const Status st = RunTransportBench(o, &paths);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(paths.size() == 3);
  const auto j = nlohmann::json::parse(TransportBenchJson(paths));
  for (const char* name : {"tcp", "ipc", "curve_tcp"}) {
    INFO(name);
    REQUIRE(j.contains(name));
    CHECK(j[name]["senders"].get<int>() == 3);
    CHECK(j[name]["io_threads"].get<int>() == 2);
    const double agg = j[name]["aggregate_GBps"].get<double>();
    CHECK(agg > 0);
    CHECK(j[name]["raw_aggregate_GBps"].get<double>() > 0);
    CHECK(j[name]["per_sender_GBps"].get<double>() == Approx(agg / 3).margin(0.002));
    CHECK(j[name]["stack_GBps"].get<double>() > 0);  // the single-sender figures are still there
  }
}

TEST_CASE("Transport bench refuses bad sender and I/O thread counts", "[net][bench]") {
  std::vector<TransportBenchPath> paths;
  TransportBenchOptions o;
  o.senders = 0;
  CHECK_THAT(RunTransportBench(o, &paths).message(), Catch::Contains("senders"));
  o.senders = 1;
  o.io_threads = -1;
  CHECK_THAT(RunTransportBench(o, &paths).message(), Catch::Contains("io_threads"));
}

}  // namespace
}  // namespace diloco::net
