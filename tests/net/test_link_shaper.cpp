// Link shaper: the pure schedule with a fake clock, then real sockets through a shaped link.
#include <catch2/catch.hpp>
#include <random>
#include <thread>

#include "daemon/net/channel.h"
#include "daemon/net/context.h"
#include "daemon/net/link_shaper.h"
#include "tests/net/transport_test_util.h"

namespace diloco::net {
namespace {

using namespace std::chrono_literals;
using testing::MakeContext;
using testing::Plain;
using testing::ProbeMessage;
using testing::SyncPubSub;
using testing::TestMessage;
using testing::TestReceiveOptions;
using testing::WaitFor;
using Clock = std::chrono::steady_clock;

double Ms(SteadyTime a, SteadyTime b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

TEST_CASE("LinkSchedule: departure from bandwidth, arrival from latency, FIFO under jitter", "[unit][net]") {
  LinkSchedule s;
  std::mt19937_64 rng(1);
  LinkParams p;
  p.bandwidth_bytes_per_s = 1e6;  // 1 MB/s: 1000 bytes = 1 ms
  p.latency_ms = 40;
  const SteadyTime t0 = SteadyTime{} + 1h;
  auto v1 = s.Admit(t0, 10000, p, rng);  // 10 ms on the wire
  CHECK(v1.kind == LinkVerdict::kDeliver);
  CHECK(Ms(t0, v1.departure) == Approx(10).margin(1e-6));
  CHECK(Ms(t0, v1.arrival) == Approx(50).margin(1e-6));
  auto v2 = s.Admit(t0 + 1ms, 5000, p, rng);  // queued behind the first
  CHECK(Ms(t0, v2.departure) == Approx(15).margin(1e-6));
  CHECK(Ms(t0, v2.arrival) == Approx(55).margin(1e-6));
  auto v3 = s.Admit(t0 + 100ms, 1000, p, rng);  // idle link: starts now
  CHECK(Ms(t0, v3.departure) == Approx(101).margin(1e-6));

  p.jitter_ms = 30;
  p.bandwidth_bytes_per_s = 0;  // unlimited
  SteadyTime last{};
  for (int i = 0; i < 1000; ++i) {
    auto v = s.Admit(t0 + 200ms + i * 100us, 100, p, rng);
    CHECK(v.arrival >= last);  // never reordered
    CHECK(Ms(v.departure, v.arrival) >= 10 - 1e-6);
    CHECK(Ms(v.departure, v.arrival) <= 70 + 1e-6 + 100 * 0.1);
    last = v.arrival;
  }
}

TEST_CASE("LinkSchedule: loss fraction and partition", "[unit][net]") {
  LinkSchedule s;
  std::mt19937_64 rng(3);
  LinkParams p;
  p.loss = 0.25;
  int lost = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) lost += s.Admit(SteadyTime{}, 10, p, rng).kind == LinkVerdict::kDropLoss;
  CHECK(lost / double(n) == Approx(0.25).margin(0.02));
  p.partitioned = true;
  CHECK(s.Admit(SteadyTime{}, 10, p, rng).kind == LinkVerdict::kDropPartition);
  CHECK_FALSE(ValidateLinkParams(LinkParams{0, -1, 0, 0, false}).ok());
  CHECK_FALSE(ValidateLinkParams(LinkParams{0, 0, 0, 1.5, false}).ok());
  CHECK(LinkParams::Wan(2, 40).bandwidth_bytes_per_s == Approx(250e6));
}

struct ShapedPubSub {
  std::unique_ptr<NetContext> ctx = MakeContext();
  std::shared_ptr<Link> link;
  std::unique_ptr<SubChannel> sub;  // the syncer side, unshaped
  std::unique_ptr<PubChannel> pub;  // the learner side, through the link

  explicit ShapedPubSub(const LinkParams& up, uint64_t seed = 1, const std::string& bind = "tcp://127.0.0.1:*") {
    LinkOptions lo;
    lo.name = "learner-0<->syncer";
    lo.up = up;
    lo.seed = seed;
    REQUIRE(Link::Create(*ctx, lo, &link).ok());
    SocketOptions so = Plain("syncer.uplink");
    so.max_frame_bytes = 16 << 20;
    REQUIRE(SubChannel::Create(*ctx, so, TestReceiveOptions(), &sub).ok());
    REQUIRE(sub->Bind(bind).ok());
    REQUIRE(sub->Subscribe("").ok());
    SocketOptions po = Plain("learner.uplink");
    po.link = link;
    REQUIRE(PubChannel::Create(*ctx, po, &pub).ok());
    REQUIRE(pub->Connect(sub->endpoint()).ok());
  }
  ~ShapedPubSub() {
    pub.reset();
    sub.reset();
    link.reset();
  }
  void Sync() {
    // Probes go through the link like everything else; lossless while syncing.
    const LinkParams saved = link->params(LinkDirection::kUp);
    LinkParams p;
    REQUIRE(link->SetParams(LinkDirection::kUp, p).ok());
    SyncPubSub(*pub, *sub, "");
    REQUIRE(link->SetParams(LinkDirection::kUp, saved).ok());
  }
};

TEST_CASE("Shaped link: 1 MiB at 10 MiB/s takes at least 90 ms", "[net][shaper]") {
  LinkParams up;
  ShapedPubSub t(up);
  t.Sync();
  up.bandwidth_bytes_per_s = 10 << 20;
  REQUIRE(t.link->SetParams(LinkDirection::kUp, up).ok());
  const auto start = Clock::now();
  for (int i = 1; i <= 16; ++i) {  // 16 x 64 KiB
    Message m = TestMessage("L", 1, i);
    m.AddOwned(std::vector<uint8_t>(64 << 10, static_cast<uint8_t>(i)));
    REQUIRE(t.pub->Publish("", m) == SendResult::kSent);
  }
  for (int i = 1; i <= 16; ++i) {
    Received r;
    REQUIRE(t.sub->Receive(&r, 5000) == RecvResult::kMessage);
    CHECK(r.meta.seq == static_cast<uint64_t>(i));
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  CHECK(ms >= 90);
  CHECK(ms < 2000);
  // The relay counts right after handing a message on: the app may be faster.
  CHECK(WaitFor([&] {
    const LinkStats st = t.link->stats(LinkDirection::kUp);
    return st.delivered >= 16 && st.queued == 0;
  }));
}

TEST_CASE("Shaped link: latency delays each message by about the set time", "[net][shaper]") {
  LinkParams up;
  ShapedPubSub t(up, 1, "inproc://lat");
  t.Sync();
  up.latency_ms = 60;
  REQUIRE(t.link->SetParams(LinkDirection::kUp, up).ok());
  for (int i = 1; i <= 3; ++i) {
    const auto start = Clock::now();
    Message m = TestMessage("L", 1, i);
    REQUIRE(t.pub->Publish("", m) == SendResult::kSent);
    Received r;
    REQUIRE(t.sub->Receive(&r, 5000) == RecvResult::kMessage);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    CHECK(ms >= 55);
    CHECK(ms < 1000);
  }
}

TEST_CASE("Shaped link: loss drops about the set fraction, gaps are detected", "[net][shaper]") {
  LinkParams up;
  ShapedPubSub t(up, 99, "inproc://loss");
  t.Sync();
  const LinkStats before = t.link->stats(LinkDirection::kUp);  // the sync probes
  const uint64_t base = before.dropped_loss + before.delivered + before.queued;
  up.loss = 0.3;
  REQUIRE(t.link->SetParams(LinkDirection::kUp, up).ok());
  const int n = 1000;
  for (int i = 1; i <= n; ++i) {
    Message m = TestMessage("L", 1, i);
    REQUIRE(t.pub->Publish("", m) == SendResult::kSent);
  }
  Message last = TestMessage("L", 1, n + 1);  // make the end observable
  up.loss = 0;
  // Loss changes apply to messages the relay takes after the change; wait until all n are taken.
  REQUIRE(WaitFor([&] {
    const LinkStats s = t.link->stats(LinkDirection::kUp);
    return s.dropped_loss + s.delivered + s.queued >= base + n;
  }));
  REQUIRE(t.link->SetParams(LinkDirection::kUp, up).ok());
  REQUIRE(t.pub->Publish("", last) == SendResult::kSent);
  int received = 0;
  Received r;
  while (t.sub->Receive(&r, 2000) == RecvResult::kMessage) {
    if (r.meta.seq == static_cast<uint64_t>(n + 1)) break;
    ++received;
  }
  const double kept = received / double(n);
  CHECK(kept == Approx(0.7).margin(0.06));
  const LinkStats st = t.link->stats(LinkDirection::kUp);
  CHECK(st.dropped_loss == static_cast<uint64_t>(n - received));
  CHECK(t.sub->stats().missed == static_cast<uint64_t>(n - received));
}

TEST_CASE("Partition drops everything; healing resumes delivery and the gap is detected", "[net][shaper]") {
  LinkParams up;
  ShapedPubSub t(up);
  t.Sync();
  uint64_t seq = 0;
  auto send = [&](int count) {
    for (int i = 0; i < count; ++i) {
      Message m = TestMessage("learner-0", 1, ++seq);
      REQUIRE(t.pub->Publish("", m) == SendResult::kSent);
    }
  };
  send(10);
  for (int i = 1; i <= 10; ++i) {
    Received r;
    REQUIRE(t.sub->Receive(&r, 5000) == RecvResult::kMessage);
    CHECK(r.meta.seq == static_cast<uint64_t>(i));
  }
  t.link->SetPartitioned(true);
  send(10);
  REQUIRE(WaitFor([&] { return t.link->stats(LinkDirection::kUp).dropped_partition >= 10; }));
  Received r;
  CHECK(t.sub->Receive(&r, 100) == RecvResult::kTimeout);
  t.link->SetPartitioned(false);
  send(5);
  REQUIRE(t.sub->Receive(&r, 5000) == RecvResult::kMessage);
  CHECK(r.meta.seq == 21);
  CHECK(r.seq.verdict == SeqVerdict::kGap);
  CHECK(r.seq.missed == 10);
  for (int i = 22; i <= 25; ++i) {
    REQUIRE(t.sub->Receive(&r, 5000) == RecvResult::kMessage);
    CHECK(r.meta.seq == static_cast<uint64_t>(i));
  }
  CHECK(t.sub->stats().gaps == 1);
}

TEST_CASE("Partition also drops messages already in flight", "[net][shaper]") {
  LinkParams up;
  ShapedPubSub t(up, 1, "inproc://inflight");
  t.Sync();
  up.latency_ms = 300;
  REQUIRE(t.link->SetParams(LinkDirection::kUp, up).ok());
  Message m = TestMessage("L", 1, 1);
  REQUIRE(t.pub->Publish("", m) == SendResult::kSent);
  REQUIRE(WaitFor([&] { return t.link->stats(LinkDirection::kUp).queued == 1; }));
  t.link->SetPartitioned(true);
  REQUIRE(WaitFor([&] { return t.link->stats(LinkDirection::kUp).queued == 0; }));
  CHECK(t.link->stats(LinkDirection::kUp).dropped_partition == 1);
  Received r;
  CHECK(t.sub->Receive(&r, 50) == RecvResult::kTimeout);
}

TEST_CASE("Shaped DEALER: both directions pass the link, the ROUTER sees the app's identity", "[net][shaper]") {
  auto ctx = MakeContext();
  std::shared_ptr<Link> link;
  LinkOptions lo;
  lo.name = "learner-3<->syncer";
  lo.up.latency_ms = 30;
  lo.down.latency_ms = 30;
  REQUIRE(Link::Create(*ctx, lo, &link).ok());
  std::unique_ptr<RouterChannel> router;
  REQUIRE(RouterChannel::Create(*ctx, Plain("syncer.snapshot"), TestReceiveOptions(), &router).ok());
  REQUIRE(router->Bind("tcp://127.0.0.1:*").ok());
  SocketOptions d = Plain("learner.snapshot");
  d.routing_id = "learner-3";
  d.link = link;
  std::unique_ptr<DealerChannel> dealer;
  REQUIRE(DealerChannel::Create(*ctx, d, TestReceiveOptions(), &dealer).ok());
  REQUIRE(dealer->Connect(router->endpoint()).ok());
  const auto start = Clock::now();
  Message req = TestMessage("learner-3", 1, 1);
  REQUIRE(dealer->Send(req, 1000) == SendResult::kSent);
  Received r;
  REQUIRE(router->Receive(&r, 5000) == RecvResult::kMessage);
  CHECK(r.peer == "learner-3");
  Message reply = TestMessage("syncer", 1, 1, "snapshot");
  REQUIRE(router->SendTo(r.peer, reply, 1000) == SendResult::kSent);
  Received back;
  REQUIRE(dealer->Receive(&back, 5000) == RecvResult::kMessage);
  CHECK(back.message.frame_view(1) == "snapshot");
  const double rtt = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  CHECK(rtt >= 55);  // 2 x 30 ms
  CHECK(WaitFor([&] { return link->stats(LinkDirection::kUp).delivered == 1; }));
  // The relay counts right after handing the message on: the app may be faster.
  CHECK(WaitFor([&] { return link->stats(LinkDirection::kDown).delivered == 1; }));
}

TEST_CASE("Shaped SUB: the downlink is shaped and subscriptions pass through", "[net][shaper]") {
  auto ctx = MakeContext();
  std::shared_ptr<Link> link;
  LinkOptions lo;
  lo.down.bandwidth_bytes_per_s = 4 << 20;  // 4 MiB/s
  REQUIRE(Link::Create(*ctx, lo, &link).ok());
  std::unique_ptr<PubChannel> pub;
  REQUIRE(PubChannel::Create(*ctx, Plain("syncer.downlink"), &pub).ok());
  REQUIRE(pub->Bind("tcp://127.0.0.1:*").ok());
  SocketOptions so = Plain("learner.downlink");
  so.link = link;
  std::unique_ptr<SubChannel> sub;
  REQUIRE(SubChannel::Create(*ctx, so, TestReceiveOptions(), &sub).ok());
  REQUIRE(sub->Connect(pub->endpoint()).ok());
  REQUIRE(sub->Subscribe("job-a").ok());
  SyncPubSub(*pub, *sub, "job-a");
  const auto start = Clock::now();
  for (int i = 1; i <= 4; ++i) {
    Message m = TestMessage("syncer", 1, i);
    m.AddOwned(std::vector<uint8_t>(100 << 10, 1));  // 400 KiB in all: >= ~97 ms at 4 MiB/s
    REQUIRE(pub->Publish("job-a", m) == SendResult::kSent);
    Message other = TestMessage("syncer", 1, 100 + i);
    REQUIRE(pub->Publish("job-b", other) == SendResult::kSent);  // filtered upstream
  }
  for (int i = 1; i <= 4; ++i) {
    Received r;
    REQUIRE(sub->Receive(&r, 5000) == RecvResult::kMessage);
    CHECK(r.topic == "job-a");
  }
  CHECK(std::chrono::duration<double, std::milli>(Clock::now() - start).count() >= 90);
  Received r;
  CHECK(sub->Receive(&r, 50) == RecvResult::kTimeout);
}

TEST_CASE("A shaped link refuses sockets it cannot shape and bad parameters", "[net][shaper]") {
  auto ctx = MakeContext();
  std::shared_ptr<Link> link;
  REQUIRE(Link::Create(*ctx, {}, &link).ok());
  SocketOptions o = Plain("r");
  o.link = link;
  std::unique_ptr<Socket> s;
  CHECK_FALSE(Socket::Create(*ctx, SocketType::kRouter, o, &s).ok());
  REQUIRE(Socket::Create(*ctx, SocketType::kPub, o, &s).ok());
  CHECK_FALSE(s->Bind("inproc://nope").ok());
  LinkParams bad;
  bad.loss = -0.1;
  CHECK_FALSE(link->SetParams(LinkDirection::kUp, bad).ok());
  // The relay's real socket obeys the security policy too.
  SocketOptions strict;
  strict.name = "strict";
  strict.link = link;
  REQUIRE(Socket::Create(*ctx, SocketType::kPub, strict, &s).ok());
  CHECK_FALSE(s->Connect("tcp://127.0.0.1:1").ok());
}

}  // namespace
}  // namespace diloco::net
