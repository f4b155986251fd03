// Transport: pure logic (sequence, liveness, Clone, endpoint policy) and real sockets
// (PUB/SUB, ROUTER/DEALER snapshot, gaps, liveness, garbage at live receivers).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <thread>

#include "daemon/net/channel.h"
#include "daemon/net/clone.h"
#include "daemon/net/context.h"
#include "daemon/net/liveness.h"
#include "daemon/net/sequence.h"
#include "daemon/net/socket.h"
#include "tests/net/transport_test_util.h"
#include "tests/temp_dir.h"

namespace diloco::net {
namespace {

using namespace std::chrono_literals;
using testing::LogCapture;
using testing::MakeContext;
using testing::Plain;
using testing::ProbeMessage;
using testing::SyncPubSub;
using testing::TestMessage;
using testing::TestReceiveOptions;
using testing::WaitFor;

// ---------------------------------------------------------------- sequence

TEST_CASE("DecideSequence classifies every arrival", "[unit][net]") {
  SenderSeqState next;
  SECTION("first") {
    auto o = DecideSequence(nullptr, 7, 100, &next);
    CHECK(o.verdict == SeqVerdict::kFirst);
    CHECK(next.epoch == 7);
    CHECK(next.last_seq == 100);
  }
  const SenderSeqState s{7, 10};
  SECTION("in order") {
    auto o = DecideSequence(&s, 7, 11, &next);
    CHECK(o.verdict == SeqVerdict::kInOrder);
    CHECK(next.last_seq == 11);
  }
  SECTION("gap of N") {
    auto o = DecideSequence(&s, 7, 15, &next);
    CHECK(o.verdict == SeqVerdict::kGap);
    CHECK(o.missed == 4);
    CHECK(next.last_seq == 15);
  }
  SECTION("duplicate and replay") {
    CHECK(DecideSequence(&s, 7, 10, &next).verdict == SeqVerdict::kDuplicate);
    CHECK(DecideSequence(&s, 7, 3, &next).verdict == SeqVerdict::kDuplicate);
    CHECK(next.last_seq == 10);
    CHECK_FALSE(DecideSequence(&s, 7, 3, &next).deliver());
  }
  SECTION("restart: new epoch starts over") {
    auto o = DecideSequence(&s, 8, 1, &next);
    CHECK(o.verdict == SeqVerdict::kRestart);
    CHECK(next.epoch == 8);
    CHECK(next.last_seq == 1);
  }
}

TEST_CASE("SequenceTracker keeps senders apart and counts", "[unit][net]") {
  SequenceTracker t;
  CHECK(t.Observe("a", 1, 1).verdict == SeqVerdict::kFirst);
  CHECK(t.Observe("b", 1, 50).verdict == SeqVerdict::kFirst);
  CHECK(t.Observe("a", 1, 2).verdict == SeqVerdict::kInOrder);
  CHECK(t.Observe("a", 1, 5).missed == 2);
  CHECK(t.Observe("b", 1, 51).verdict == SeqVerdict::kInOrder);
  CHECK(t.Observe("b", 1, 51).verdict == SeqVerdict::kDuplicate);
  CHECK(t.Observe("a", 2, 1).verdict == SeqVerdict::kRestart);
  CHECK(t.gaps() == 1);
  CHECK(t.missed() == 2);
  CHECK(t.duplicates() == 1);
  CHECK(t.restarts() == 1);
  CHECK(t.senders() == 2);
}

// ---------------------------------------------------------------- liveness (fake clock)

TEST_CASE("DecideLiveness: dead after 3 missed intervals, with the reason", "[unit][net]") {
  const SteadyTime t0{};
  LivenessOptions o{100, 3};
  auto d = DecideLiveness(t0 + 299ms, t0, o);
  CHECK(d.state == PeerState::kAlive);
  CHECK(d.missed_intervals == 2);
  d = DecideLiveness(t0 + 300ms, t0, o);
  CHECK(d.state == PeerState::kDead);
  CHECK(d.missed_intervals == 3);
  CHECK_THAT(d.reason, Catch::Contains("silent for 300 ms"));
  CHECK(DecideLiveness(t0, t0 + 5ms, o).state == PeerState::kAlive);  // clock skew: never negative
}

TEST_CASE("LivenessTracker reports each transition once", "[unit][net]") {
  SteadyTime now{};
  LivenessTracker t({100, 3});
  auto c = t.Heard("a", now);
  REQUIRE(c);
  CHECK(c->state == PeerState::kAlive);
  CHECK_FALSE(t.Heard("a", now + 10ms));
  t.Heard("b", now);
  for (int i = 1; i <= 5; ++i) t.Heard("b", now + i * 90ms);  // b keeps beating
  CHECK(t.Check(now + 250ms).empty());
  auto changes = t.Check(now + 310ms);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].peer == "a");
  CHECK(changes[0].state == PeerState::kDead);
  CHECK(t.Check(now + 400ms).empty());  // reported once
  CHECK(t.state("a") == PeerState::kDead);
  CHECK(t.alive() == std::vector<std::string>{"b"});
  auto back = t.Heard("a", now + 500ms);
  REQUIRE(back);
  CHECK(back->state == PeerState::kAlive);
  CHECK(t.alive_count() == 1 + (t.state("b") == PeerState::kAlive ? 1 : 0));
}

TEST_CASE("HeartbeatTimer fires once per interval without bursts", "[unit][net]") {
  SteadyTime now{};
  HeartbeatTimer h(100);
  CHECK(h.Due(now));
  CHECK_FALSE(h.Due(now + 50ms));
  CHECK(h.MsUntilDue(now + 50ms) > 0);
  CHECK(h.Due(now + 100ms));
  CHECK(h.Due(now + 1000ms));  // after a stall: one beat, not nine
  CHECK_FALSE(h.Due(now + 1050ms));
}

// ---------------------------------------------------------------- Clone (pure)

VersionedUpdate Update(uint64_t key, uint64_t version, bool full = false) {
  VersionedUpdate u;
  u.key = key;
  u.version = version;
  u.full = full;
  std::string body = std::to_string(key);
  body.append("/").append(std::to_string(version));
  u.message.AddCopy(body);
  return u;
}

TEST_CASE("CloneClient drops updates older than the snapshot and applies newer ones", "[unit][net]") {
  CloneClient c;
  c.BeginSnapshot();
  std::vector<VersionedUpdate> apply;
  CHECK(c.OnUpdate(Update(0, 4), &apply) == CloneVerdict::kBuffered);
  CHECK(c.OnUpdate(Update(0, 5), &apply) == CloneVerdict::kBuffered);
  CHECK(c.OnUpdate(Update(1, 2), &apply) == CloneVerdict::kBuffered);
  CHECK(c.OnUpdate(Update(0, 6), &apply) == CloneVerdict::kBuffered);
  CHECK(apply.empty());
  c.OnSnapshot({{0, 5}, {1, 2}}, &apply);
  REQUIRE(apply.size() == 1);
  CHECK(apply[0].key == 0);
  CHECK(apply[0].version == 6);
  CHECK(c.stale_dropped() == 3);
  CHECK_FALSE(c.awaiting_snapshot());
  apply.clear();
  CHECK(c.OnUpdate(Update(1, 3), &apply) == CloneVerdict::kApply);
  CHECK(c.OnUpdate(Update(1, 3), &apply) == CloneVerdict::kStale);
  CHECK(c.version(1) == 3);
  SECTION("a skipped version asks for a new snapshot") {
    CHECK(c.OnUpdate(Update(0, 8), &apply) == CloneVerdict::kGap);
    CHECK(c.awaiting_snapshot());
    CHECK(c.OnUpdate(Update(0, 9), &apply) == CloneVerdict::kBuffered);
    apply.clear();
    c.OnSnapshot({{0, 8}}, &apply);
    REQUIRE(apply.size() == 1);
    CHECK(apply[0].version == 9);
  }
  SECTION("a full update applies across a gap") {
    CHECK(c.OnUpdate(Update(0, 9, true), &apply) == CloneVerdict::kApply);
    CHECK(c.version(0) == 9);
  }
  SECTION("a snapshot never moves a key backwards") {
    c.BeginSnapshot();
    c.OnSnapshot({{1, 1}}, &apply);
    CHECK(c.version(1) == 3);
  }
}

TEST_CASE("CloneClient bounds its buffer while awaiting", "[unit][net]") {
  CloneClient c({2});
  c.BeginSnapshot();
  std::vector<VersionedUpdate> apply;
  c.OnUpdate(Update(0, 1), &apply);
  c.OnUpdate(Update(0, 2), &apply);
  CHECK(c.OnUpdate(Update(0, 3), &apply) == CloneVerdict::kOverflow);
  CHECK(c.buffered() == 2);
}

// ---------------------------------------------------------------- endpoint policy

TEST_CASE("Endpoint security: plaintext only where configured, never off loopback", "[unit][net]") {
  SocketOptions none;
  SocketOptions plain;
  plain.allow_plaintext = true;
  SocketOptions curve;
  curve.curve = CurveOptions{};
  CHECK(CheckEndpointSecurity("inproc://x", none).ok());
  CHECK_FALSE(CheckEndpointSecurity("ipc:///tmp/x", none).ok());
  CHECK(CheckEndpointSecurity("ipc:///tmp/x", plain).ok());
  CHECK_FALSE(CheckEndpointSecurity("tcp://127.0.0.1:5555", none).ok());
  CHECK(CheckEndpointSecurity("tcp://127.0.0.1:5555", plain).ok());
  CHECK(CheckEndpointSecurity("tcp://localhost:5555", plain).ok());
  CHECK(CheckEndpointSecurity("tcp://[::1]:5555", plain).ok());
  const Status remote = CheckEndpointSecurity("tcp://10.1.2.3:5555", plain);
  CHECK_FALSE(remote.ok());
  CHECK_THAT(remote.message(), Catch::Contains("dilococtl keygen"));
  CHECK_FALSE(CheckEndpointSecurity("tcp://*:5555", plain).ok());
  CHECK_FALSE(CheckEndpointSecurity("tcp://0.0.0.0:5555", plain).ok());
  CHECK_FALSE(CheckEndpointSecurity("tcp://127.evil.com:5555", plain).ok());
  CHECK(CheckEndpointSecurity("tcp://10.1.2.3:5555", curve).ok());
  CHECK_FALSE(CheckEndpointSecurity("pgm://x", plain).ok());
}

TEST_CASE("Bind and Connect enforce the endpoint policy", "[net]") {
  auto ctx = MakeContext();
  SocketOptions o;
  o.name = "strict";
  std::unique_ptr<Socket> s;
  REQUIRE(Socket::Create(*ctx, SocketType::kPull, o, &s).ok());
  const Status st = s->Bind("tcp://127.0.0.1:*");
  CHECK_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("strict"));
  CHECK_FALSE(s->Connect("tcp://192.0.2.1:5555").ok());
  CHECK(s->Bind("inproc://strict-ok").ok());
}

TEST_CASE("Bind on a taken address says so by its code, not only in its text", "[net]") {
  auto ctx = MakeContext();
  std::unique_ptr<Socket> a, b;
  REQUIRE(Socket::Create(*ctx, SocketType::kPull, Plain("first"), &a).ok());
  REQUIRE(Socket::Create(*ctx, SocketType::kPull, Plain("second"), &b).ok());
  REQUIRE(a->Bind("tcp://127.0.0.1:*").ok());
  const Status st = b->Bind(a->endpoint());
  CHECK(st.code() == StatusCode::kAddressInUse);
  CHECK(st.WithContext("syncer uplink").code() == StatusCode::kAddressInUse);
  CHECK_THAT(st.message(), Catch::Contains("second"));
  CHECK(b->Bind("pgm://x").code() == StatusCode::kError);  // refused by the endpoint policy
}

// ---------------------------------------------------------------- socket options

TEST_CASE("Sockets always carry linger, HWMs, max message size and ROUTER_MANDATORY", "[net]") {
  auto ctx = MakeContext();
  SocketOptions o = Plain("opts");
  o.linger_ms = 250;
  o.send_hwm_msgs = 17;
  o.recv_hwm_msgs = 19;
  o.max_frame_bytes = 12345;
  std::unique_ptr<Socket> r;
  REQUIRE(Socket::Create(*ctx, SocketType::kRouter, o, &r).ok());
  CHECK(r->ref().get(zmq::sockopt::linger) == 250);
  CHECK(r->ref().get(zmq::sockopt::sndhwm) == 17);
  CHECK(r->ref().get(zmq::sockopt::rcvhwm) == 19);
  CHECK(r->ref().get(zmq::sockopt::maxmsgsize) == 12345);
  REQUIRE(r->Bind("inproc://opts").ok());
  Message m;
  m.AddCopy(std::string("nobody"));
  m.AddCopy(std::string("payload"));
  CHECK(r->Send(m, 0) == SendResult::kUnroutable);  // ROUTER_MANDATORY: not silently dropped
  CHECK(m.size() == 2);                              // handed back unchanged

  SocketOptions bad = o;
  bad.send_hwm_msgs = 0;
  std::unique_ptr<Socket> s;
  CHECK_FALSE(Socket::Create(*ctx, SocketType::kPub, bad, &s).ok());
  bad = o;
  bad.linger_ms = -1;
  CHECK_FALSE(Socket::Create(*ctx, SocketType::kPub, bad, &s).ok());
}

TEST_CASE("A frame above max_frame_bytes drops that peer; the receiver serves the others", "[net]") {
  auto ctx = MakeContext();
  SocketOptions ro = Plain("pull");
  ro.max_frame_bytes = 1024;
  std::unique_ptr<Socket> pull, big, good;
  REQUIRE(Socket::Create(*ctx, SocketType::kPull, ro, &pull).ok());
  REQUIRE(pull->Bind("tcp://127.0.0.1:*").ok());
  REQUIRE(Socket::Create(*ctx, SocketType::kPush, Plain("big"), &big).ok());
  REQUIRE(Socket::Create(*ctx, SocketType::kPush, Plain("good"), &good).ok());
  REQUIRE(big->Connect(pull->endpoint()).ok());
  Message m;
  m.AddOwned(std::vector<uint8_t>(4096, 1));
  CHECK(big->Send(m, 1000) == SendResult::kSent);
  REQUIRE(good->Connect(pull->endpoint()).ok());
  Message ok;
  ok.AddCopy(std::string("small"));
  CHECK(good->Send(ok, 1000) == SendResult::kSent);
  Message got;
  REQUIRE(pull->Receive(&got, 5000) == RecvResult::kMessage);
  CHECK(got.frame_view(0) == "small");
  CHECK(pull->Receive(&got, 50) == RecvResult::kTimeout);  // the big one never arrives
}

TEST_CASE("Zero-copy frames keep their owner alive until sent", "[net]") {
  auto ctx = MakeContext();
  std::unique_ptr<Socket> a, b;
  REQUIRE(Socket::Create(*ctx, SocketType::kPair, Plain("a"), &a).ok());
  REQUIRE(Socket::Create(*ctx, SocketType::kPair, Plain("b"), &b).ok());
  REQUIRE(a->Bind("inproc://zc").ok());
  REQUIRE(b->Connect("inproc://zc").ok());
  auto buf = std::make_shared<std::vector<uint8_t>>(1 << 20, 7);
  std::weak_ptr<std::vector<uint8_t>> weak = buf;
  Message m;
  m.AddShared(buf, buf->data(), buf->size());
  m.AddOwned(std::vector<uint8_t>(100, 9));
  buf.reset();
  CHECK_FALSE(weak.expired());  // the message holds it
  REQUIRE(a->Send(m) == SendResult::kSent);
  Message got;
  REQUIRE(b->Receive(&got, 2000) == RecvResult::kMessage);
  REQUIRE(got.size() == 2);
  CHECK(got.frame(0).size() == (1u << 20));
  CHECK(got.frame(0)[12345] == 7);
  CHECK(got.frame(1)[99] == 9);
  got.Clear();
  CHECK(WaitFor([&] { return weak.expired(); }));
}

TEST_CASE("Receive waits out its timeout (no early return on a spurious wakeup)", "[net]") {
  auto ctx = MakeContext();
  std::unique_ptr<Socket> pull, push;
  REQUIRE(Socket::Create(*ctx, SocketType::kPull, Plain("pull"), &pull).ok());
  REQUIRE(pull->Bind("tcp://127.0.0.1:*").ok());
  // A peer connecting wakes the poller without a message: Receive must keep waiting.
  REQUIRE(Socket::Create(*ctx, SocketType::kPush, Plain("push"), &push).ok());
  REQUIRE(push->Connect(pull->endpoint()).ok());
  const auto start = std::chrono::steady_clock::now();
  Message m;
  CHECK(pull->Receive(&m, 150) == RecvResult::kTimeout);
  CHECK(std::chrono::steady_clock::now() - start >= 149ms);
  const auto start1 = std::chrono::steady_clock::now();
  CHECK(pull->Receive(&m, 1) == RecvResult::kTimeout);
  CHECK(std::chrono::steady_clock::now() - start1 >= 900us);  // 1 ms is not rounded down to 0
}

TEST_CASE("Net log lines carry a ms timestamp, the module and the site", "[unit][net]") {
  LogCapture logs;
  SetNetLogSite("site-a");
  NetLog("net.test", "hello");
  SetNetLogSite("");
  NetLog("net.test", "bye");
  const auto lines = logs.lines();
  REQUIRE(lines.size() == 2);
  // 2026-12-02T18:04:41.123Z [net.test site-a] hello
  CHECK(lines[0].size() == 24 + std::string(" [net.test site-a] hello").size());
  CHECK(lines[0][10] == 'T');
  CHECK(lines[0][19] == '.');
  CHECK(lines[0][23] == 'Z');
  CHECK(lines[0].substr(24) == " [net.test site-a] hello");
  CHECK(lines[1].substr(24) == " [net.test] bye");
  CHECK(LogThisOccurrence(1));
  CHECK(LogThisOccurrence(64));
  CHECK_FALSE(LogThisOccurrence(3));
  CHECK_FALSE(LogThisOccurrence(0));
}

// ---------------------------------------------------------------- PUB/SUB channels

void PubSubRoundTrip(const std::string& bind_endpoint) {
  auto ctx = MakeContext();
  std::unique_ptr<SubChannel> sub;
  std::unique_ptr<PubChannel> pub;
  REQUIRE(SubChannel::Create(*ctx, Plain("syncer.uplink"), TestReceiveOptions(), &sub).ok());
  REQUIRE(sub->Bind(bind_endpoint).ok());
  REQUIRE(sub->Subscribe("job1").ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("learner.uplink"), &pub).ok());
  REQUIRE(pub->Connect(sub->endpoint()).ok());
  SyncPubSub(*pub, *sub, "job1");

  for (uint64_t s = 1; s <= 20; ++s) {
    Message m = TestMessage("learner-0", 9, s, "delta " + std::to_string(s));
    REQUIRE(pub->Publish("job1", m) == SendResult::kSent);
    Message other = TestMessage("learner-0", 9, 1000 + s);
    REQUIRE(pub->Publish("job2", other) == SendResult::kSent);  // filtered out by topic
  }
  for (uint64_t s = 1; s <= 20; ++s) {
    Received r;
    REQUIRE(sub->Receive(&r, 5000) == RecvResult::kMessage);
    CHECK(r.topic == "job1");
    CHECK(r.meta.sender == "learner-0");
    CHECK(r.meta.seq == s);
    CHECK(r.seq.verdict == (s == 1 ? SeqVerdict::kFirst : SeqVerdict::kInOrder));
    REQUIRE(r.message.size() == 2);
    CHECK(r.message.frame_view(1) == "delta " + std::to_string(s));
  }
  Received r;
  CHECK(sub->Receive(&r, 20) == RecvResult::kTimeout);
  CHECK(sub->stats().rejected == 0);
  CHECK(sub->stats().gaps == 0);
}

TEST_CASE("PUB/SUB channel over inproc, ipc and tcp loopback", "[net]") {
  SECTION("inproc") { PubSubRoundTrip("inproc://pubsub"); }
  SECTION("ipc") {
    diloco::testing::TempDir dir;
    PubSubRoundTrip("ipc://" + dir.file("uplink.sock"));
  }
  SECTION("tcp") { PubSubRoundTrip("tcp://127.0.0.1:*"); }
}

TEST_CASE("Sequence gaps, duplicates and restarts are detected on a live SUB", "[net]") {
  auto ctx = MakeContext();
  std::unique_ptr<SubChannel> sub;
  std::unique_ptr<PubChannel> pub;
  REQUIRE(SubChannel::Create(*ctx, Plain("sub"), TestReceiveOptions(), &sub).ok());
  REQUIRE(sub->Bind("tcp://127.0.0.1:*").ok());
  REQUIRE(sub->Subscribe("").ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("pub"), &pub).ok());
  REQUIRE(pub->Connect(sub->endpoint()).ok());
  SyncPubSub(*pub, *sub, "");
  for (uint64_t s : {1, 2, 3, 7, 7, 8, 2}) {
    Message m = TestMessage("L", 1, s);
    pub->Publish("", m);
  }
  Message restart = TestMessage("L", 2, 1);
  pub->Publish("", restart);
  std::vector<std::pair<uint64_t, SeqVerdict>> got;
  Received r;
  while (sub->Receive(&r, 300) == RecvResult::kMessage) {
    got.push_back({r.meta.seq, r.seq.verdict});
    if (r.seq.verdict == SeqVerdict::kGap) CHECK(r.seq.missed == 3);
  }
  const std::vector<std::pair<uint64_t, SeqVerdict>> want = {
      {1, SeqVerdict::kFirst}, {2, SeqVerdict::kInOrder}, {3, SeqVerdict::kInOrder},
      {7, SeqVerdict::kGap},   {8, SeqVerdict::kInOrder}, {1, SeqVerdict::kRestart}};
  CHECK(got == want);
  const ChannelStats st = sub->stats();
  CHECK(st.gaps == 1);
  CHECK(st.missed == 3);
  CHECK(st.duplicates == 2);
  CHECK(st.restarts == 1);
}

TEST_CASE("Sequences per topic: heartbeats and deltas numbered separately", "[net]") {
  auto ctx = MakeContext();
  ReceiveOptions ro = TestReceiveOptions();
  ro.sequence_per_topic = true;
  std::unique_ptr<SubChannel> sub;
  std::unique_ptr<PubChannel> data, beat;
  REQUIRE(SubChannel::Create(*ctx, Plain("sub"), ro, &sub).ok());
  REQUIRE(sub->Bind("inproc://topics").ok());
  REQUIRE(sub->Subscribe("").ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("data"), &data).ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("beat"), &beat).ok());
  REQUIRE(data->Connect("inproc://topics").ok());
  REQUIRE(beat->Connect("inproc://topics").ok());
  SyncPubSub(*data, *sub, "j/delta");
  SyncPubSub(*beat, *sub, "j/hb");
  for (uint64_t s = 1; s <= 3; ++s) {
    Message d = TestMessage("L", 1, s);
    data->Publish("j/delta", d);
    Message h = TestMessage("L", 1, s);
    beat->Publish("j/hb", h);
  }
  int n = 0;
  Received r;
  while (n < 6 && sub->Receive(&r, 2000) == RecvResult::kMessage) ++n;
  CHECK(n == 6);
  CHECK(sub->stats().gaps == 0);
  CHECK(sub->stats().duplicates == 0);
}

TEST_CASE("Liveness on a live channel: a silent publisher is declared dead (fake clock)", "[net]") {
  auto ctx = MakeContext();
  auto now = std::make_shared<SteadyTime>();
  ReceiveOptions ro = TestReceiveOptions();
  ro.liveness = LivenessOptions{1000, 3};
  ro.clock = [now] { return *now; };
  std::unique_ptr<SubChannel> sub;
  std::unique_ptr<PubChannel> a, b;
  REQUIRE(SubChannel::Create(*ctx, Plain("syncer.uplink"), ro, &sub).ok());
  REQUIRE(sub->Bind("inproc://live").ok());
  REQUIRE(sub->Subscribe("").ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("a"), &a).ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("b"), &b).ok());
  REQUIRE(a->Connect("inproc://live").ok());
  REQUIRE(b->Connect("inproc://live").ok());
  SyncPubSub(*a, *sub, "");
  SyncPubSub(*b, *sub, "");
  uint64_t seq = 0;
  auto beat = [&](PubChannel& p, const std::string& name) {
    Message m = TestMessage(name, 1, ++seq);  // seq per sender does not matter here
    REQUIRE(p.Publish("", m) == SendResult::kSent);
    Received r;
    REQUIRE(sub->Receive(&r, 2000) == RecvResult::kMessage);
  };
  beat(*a, "A");
  beat(*b, "B");
  auto changes = sub->TakeLivenessChanges(*now);
  CHECK(changes.size() == 2);  // both joined
  for (int i = 0; i < 4; ++i) {  // B keeps beating, A went silent
    *now += 1000ms;
    beat(*b, "B");
    changes = sub->TakeLivenessChanges(*now);
    if (i < 2) CHECK(changes.empty());
  }
  // A was last heard at t=0; at t=3 s it had missed 3 intervals.
  CHECK(sub->liveness()->state("A") == PeerState::kDead);
  CHECK(sub->liveness()->state("B") == PeerState::kAlive);
  beat(*a, "A");
  changes = sub->TakeLivenessChanges(*now);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].peer == "A");
  CHECK(changes[0].state == PeerState::kAlive);
}

// ---------------------------------------------------------------- ROUTER/DEALER snapshot (Clone)

// A tiny "syncer": state = version per key. Publishes every update on PUB and answers snapshot
// requests on ROUTER with [ "S" | key=version,... ].
struct CloneServer {
  std::unique_ptr<PubChannel> pub;
  std::unique_ptr<RouterChannel> router;
  std::map<uint64_t, uint64_t> versions;
  uint64_t seq = 0;
  uint64_t snapshots_served = 0;

  void PublishUpdate(uint64_t key) {
    const uint64_t v = ++versions[key];
    Message m = TestMessage("syncer", 1, ++seq, std::to_string(key) + ":" + std::to_string(v));
    pub->Publish("g", m);
  }
  void ServeOnce(int timeout_ms) {
    Received r;
    if (router->Receive(&r, timeout_ms) != RecvResult::kMessage) return;
    std::string body;
    for (const auto& [k, v] : versions) body += std::to_string(k) + "=" + std::to_string(v) + ",";
    Message reply;
    reply.AddCopy(std::string("P"));  // unsequenced
    reply.AddCopy("S|" + body);
    if (router->SendTo(r.peer, reply) == SendResult::kSent) ++snapshots_served;
  }
};

std::pair<uint64_t, uint64_t> ParseUpdate(const Message& m) {
  const std::string s(m.frame_view(1));
  const size_t colon = s.find(':');
  return {std::stoull(s.substr(0, colon)), std::stoull(s.substr(colon + 1))};
}

TEST_CASE("Clone pattern over ROUTER/DEALER: snapshot, then updates newer than it", "[net]") {
  auto ctx = MakeContext();
  diloco::testing::TempDir dir;
  CloneServer server;
  REQUIRE(PubChannel::Create(*ctx, Plain("syncer.downlink"), &server.pub).ok());
  REQUIRE(server.pub->Bind("ipc://" + dir.file("down.sock")).ok());
  REQUIRE(RouterChannel::Create(*ctx, Plain("syncer.snapshot"), TestReceiveOptions(), &server.router).ok());
  REQUIRE(server.router->Bind("tcp://127.0.0.1:*").ok());
  const std::string snapshot_ep = server.router->endpoint();

  std::atomic<bool> stop{false};
  std::atomic<int> published{0};
  std::thread syncer([&] {
    // Updates stream continuously while snapshots are served: the race the pattern handles.
    while (!stop) {
      server.PublishUpdate(published % 3);
      ++published;
      server.ServeOnce(1);
    }
  });

  // Learner: subscribe first, then request the snapshot.
  std::unique_ptr<SubChannel> sub;
  std::unique_ptr<DealerChannel> dealer;
  REQUIRE(SubChannel::Create(*ctx, Plain("learner.downlink"), TestReceiveOptions(), &sub).ok());
  REQUIRE(sub->Connect("ipc://" + dir.file("down.sock")).ok());
  REQUIRE(sub->Subscribe("g").ok());
  Received r;
  REQUIRE(sub->Receive(&r, 5000) == RecvResult::kMessage);  // the subscription is live
  CloneClient clone;
  clone.BeginSnapshot();
  SocketOptions dopt = Plain("learner.snapshot");
  dopt.routing_id = "learner-7";
  REQUIRE(DealerChannel::Create(*ctx, dopt, TestReceiveOptions(), &dealer).ok());
  REQUIRE(dealer->Connect(snapshot_ep).ok());

  std::map<uint64_t, uint64_t> state;  // the learner's copy: version per key
  std::vector<VersionedUpdate> apply;
  auto drain_updates = [&](int timeout_ms) {
    Received u;
    while (sub->Receive(&u, timeout_ms) == RecvResult::kMessage) {
      auto [k, v] = ParseUpdate(u.message);
      VersionedUpdate vu;
      vu.key = k;
      vu.version = v;
      vu.message = std::move(u.message);
      clone.OnUpdate(std::move(vu), &apply);
      timeout_ms = 0;
    }
  };
  // Buffer a few updates before asking: they are older than the snapshot and must be dropped.
  while (clone.buffered() < 5) drain_updates(100);
  Message req = ProbeMessage();
  REQUIRE(dealer->Send(req, 1000) == SendResult::kSent);
  Received snap;
  bool have_snapshot = false;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!have_snapshot && std::chrono::steady_clock::now() < deadline) {
    drain_updates(0);
    if (dealer->Receive(&snap, 5) == RecvResult::kMessage) have_snapshot = true;
  }
  REQUIRE(have_snapshot);
  drain_updates(0);  // updates that raced the snapshot are buffered too
  std::map<uint64_t, uint64_t> snap_versions;
  std::string body(snap.message.frame_view(1).substr(2));
  for (size_t pos = 0; pos < body.size();) {
    const size_t eq = body.find('=', pos), comma = body.find(',', pos);
    snap_versions[std::stoull(body.substr(pos, eq - pos))] = std::stoull(body.substr(eq + 1, comma - eq - 1));
    pos = comma + 1;
  }
  state = snap_versions;
  clone.OnSnapshot(snap_versions, &apply);
  const int target = published + 300;
  while (published < target) drain_updates(10);
  stop = true;
  syncer.join();
  drain_updates(200);
  for (auto& u : apply) {
    CHECK(u.version == state[u.key] + 1);  // every applied update is exactly the next version
    state[u.key] = u.version;
  }
  CHECK_FALSE(clone.awaiting_snapshot());
  CHECK(state == server.versions);  // the learner converged on the syncer's state
  CHECK(server.snapshots_served == 1);
  CHECK(clone.stale_dropped() >= 5);  // updates older than the snapshot were dropped
}

// ---------------------------------------------------------------- garbage at live receivers

// Raw bytes at a ZeroMQ tcp port (not even ZMTP): the connection is dropped, nothing else.
void SendRawTcpGarbage(const std::string& endpoint, std::mt19937& rng) {
  const size_t colon = endpoint.rfind(':');
  const int port = std::stoi(endpoint.substr(colon + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::vector<uint8_t> junk(4096);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    junk[0] = 0xff;  // looks like a ZMTP signature start, then lies
    (void)!::write(fd, junk.data(), junk.size());
  }
  ::close(fd);
}

Message RandomFrames(std::mt19937& rng) {
  Message m;
  const int frames = 1 + rng() % 4;
  for (int f = 0; f < frames; ++f) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    if (!s.empty() && (s[0] == 'T' || s[0] == 'P')) s[0] = 'X';  // never a valid test header
    m.AddCopy(s);
  }
  return m;
}

TEST_CASE("Garbage at a live SUB: rejected, counted, logged; good peers still served", "[net]") {
  LogCapture logs;
  auto ctx = MakeContext();
  std::unique_ptr<SubChannel> sub;
  std::unique_ptr<PubChannel> good, evil;
  REQUIRE(SubChannel::Create(*ctx, Plain("syncer.uplink"), TestReceiveOptions(), &sub).ok());
  REQUIRE(sub->Bind("tcp://127.0.0.1:*").ok());
  REQUIRE(sub->Subscribe("").ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("good"), &good).ok());
  REQUIRE(PubChannel::Create(*ctx, Plain("evil"), &evil).ok());
  REQUIRE(good->Connect(sub->endpoint()).ok());
  REQUIRE(evil->Connect(sub->endpoint()).ok());
  SyncPubSub(*good, *sub, "");
  SyncPubSub(*evil, *sub, "");

  std::mt19937 rng(42);
  const int kGarbage = 300;
  uint64_t good_seq = 0;
  int good_received = 0;
  for (int i = 0; i < kGarbage; ++i) {
    Message junk = RandomFrames(rng);
    // evil publishes [junk topic][junk...] via a real PUB: the topic frame is junk too
    Message m;
    for (auto& f : junk.frames()) m.AddFrame(std::move(f));
    REQUIRE(evil->socket().Send(m, 1000) == SendResult::kSent);
    if (i % 50 == 0) SendRawTcpGarbage(sub->endpoint(), rng);
    if (i % 10 == 0) {
      Message ok = TestMessage("learner-0", 1, ++good_seq);
      REQUIRE(good->Publish("", ok) == SendResult::kSent);
    }
    Received r;
    while (sub->Receive(&r, 0) == RecvResult::kMessage) {
      CHECK(r.meta.sender == "learner-0");
      ++good_received;
    }
  }
  Received r;
  while (good_received < static_cast<int>(good_seq) && sub->Receive(&r, 2000) == RecvResult::kMessage) {
    CHECK(r.meta.sender == "learner-0");
    ++good_received;
  }
  CHECK(good_received == static_cast<int>(good_seq));
  CHECK(sub->stats().gaps == 0);
  // Every garbage message (1-frame ones have no payload after the topic; the rest fail validation).
  CHECK(WaitFor([&] {
    Received x;
    (void)sub->Receive(&x, 0);
    return sub->stats().rejected == static_cast<uint64_t>(kGarbage);
  }));
  CHECK(logs.Contains("[net.channel] syncer.uplink: rejected message"));
  CHECK(logs.Contains("from 127.0.0.1"));
}

TEST_CASE("Garbage at a live ROUTER: rejected, counted, logged; good peers still served", "[net]") {
  LogCapture logs;
  auto ctx = MakeContext();
  std::unique_ptr<RouterChannel> router;
  REQUIRE(RouterChannel::Create(*ctx, Plain("syncer.snapshot"), TestReceiveOptions(), &router).ok());
  REQUIRE(router->Bind("tcp://127.0.0.1:*").ok());
  std::unique_ptr<DealerChannel> good;
  SocketOptions go = Plain("good");
  go.routing_id = "learner-1";
  REQUIRE(DealerChannel::Create(*ctx, go, TestReceiveOptions(), &good).ok());
  REQUIRE(good->Connect(router->endpoint()).ok());
  std::unique_ptr<Socket> evil;
  REQUIRE(Socket::Create(*ctx, SocketType::kDealer, Plain("evil"), &evil).ok());
  REQUIRE(evil->Connect(router->endpoint()).ok());

  std::mt19937 rng(7);
  int served = 0;
  for (int i = 0; i < 200; ++i) {
    Message junk = RandomFrames(rng);
    REQUIRE(evil->Send(junk, 1000) == SendResult::kSent);
    if (i % 40 == 0) SendRawTcpGarbage(router->endpoint(), rng);
    if (i % 20 == 0) {
      Message req = TestMessage("learner-1", 1, i + 1);
      REQUIRE(good->Send(req, 1000) == SendResult::kSent);
    }
    Received r;
    while (router->Receive(&r, 0) == RecvResult::kMessage) {
      CHECK(r.peer == "learner-1");
      Message reply = TestMessage("syncer", 1, ++served);
      CHECK(router->SendTo(r.peer, reply) == SendResult::kSent);
    }
  }
  Received r;
  while (served < 10 && router->Receive(&r, 2000) == RecvResult::kMessage) {
    Message reply = TestMessage("syncer", 1, ++served);
    CHECK(router->SendTo(r.peer, reply) == SendResult::kSent);
  }
  CHECK(served == 10);
  int replies = 0;
  while (replies < 10 && good->Receive(&r, 2000) == RecvResult::kMessage) ++replies;
  CHECK(replies == 10);
  CHECK(WaitFor([&] {
    Received x;
    (void)router->Receive(&x, 0);
    return router->stats().rejected == 200;
  }));
  CHECK(logs.Contains("syncer.snapshot: rejected message"));
}

}  // namespace
}  // namespace diloco::net
