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

using Departures = std::vector<FairShareSchedule::Departure>;

TEST_CASE("FairShareSchedule: one flow is FIFO at the full bandwidth", "[unit][net]") {
  FairShareSchedule s(1e6);  // 1 MB/s: 1000 bytes = 1 ms
  const SteadyTime t0 = SteadyTime{} + 1h;
  Departures d;
  s.Enqueue(0, 10000, t0, &d);
  s.Enqueue(0, 5000, t0 + 1ms, &d);
  CHECK(d.empty());
  REQUIRE(s.NextDeparture());
  CHECK(Ms(t0, *s.NextDeparture()) == Approx(10).margin(1e-3));
  s.Advance(t0 + 9ms, &d);
  CHECK(d.empty());
  s.Advance(t0 + 20ms, &d);
  REQUIRE(d.size() == 2);
  CHECK(Ms(t0, d[0].time) == Approx(10).margin(1e-3));
  CHECK(Ms(t0, d[1].time) == Approx(15).margin(1e-3));  // queued behind the first
  d.clear();
  s.Enqueue(0, 1000, t0 + 100ms, &d);  // idle link: starts now
  s.Advance(t0 + 200ms, &d);
  REQUIRE(d.size() == 1);
  CHECK(Ms(t0, d[0].time) == Approx(101).margin(1e-3));
  CHECK(s.waiting() == 0);
  CHECK_FALSE(s.NextDeparture());
}

TEST_CASE("FairShareSchedule: flows share the bandwidth; a small message is not stuck behind a big one",
          "[unit][net]") {
  FairShareSchedule s(1e6);
  const SteadyTime t0 = SteadyTime{} + 1h;
  Departures d;
  s.Enqueue(0, 1000000, t0, &d);        // a bulk delta: 1 s alone
  s.Enqueue(1, 1000, t0 + 500ms, &d);   // a heartbeat on another socket
  s.Advance(t0 + 2s, &d);
  REQUIRE(d.size() == 2);
  CHECK(d[0].flow == 1);
  CHECK(Ms(t0, d[0].time) == Approx(502).margin(1e-3));  // half the bandwidth: 2 ms
  CHECK(d[1].flow == 0);
  CHECK(Ms(t0, d[1].time) == Approx(1001).margin(1e-3));  // the delta lost 1 ms to it
}

TEST_CASE("FairShareSchedule: bandwidth changes apply from the moment of the change", "[unit][net]") {
  FairShareSchedule s(1e6);
  const SteadyTime t0 = SteadyTime{} + 1h;
  Departures d;
  s.Enqueue(3, 10000, t0, &d);
  s.SetBandwidth(t0 + 5ms, 0.5e6, &d);  // 5000 bytes done, 5000 left at half speed: 10 ms
  s.Advance(t0 + 1s, &d);
  REQUIRE(d.size() == 1);
  CHECK(Ms(t0, d[0].time) == Approx(15).margin(1e-3));
  d.clear();
  s.Enqueue(3, 10000, t0 + 2s, &d);
  s.SetBandwidth(t0 + 2s + 1ms, 0, &d);  // unlimited: leaves at once
  REQUIRE(d.size() == 1);
  CHECK(Ms(t0, d[0].time) == Approx(2001).margin(1e-3));
  d.clear();
  s.Enqueue(3, 10000, t0 + 3s, &d);
  REQUIRE(d.size() == 1);
}

TEST_CASE("ArrivalTime: latency plus jitter, never reordered", "[unit][net]") {
  std::mt19937_64 rng(1);
  LinkParams p;
  p.latency_ms = 40;
  const SteadyTime t0 = SteadyTime{} + 1h;
  CHECK(Ms(t0, ArrivalTime(t0, p, SteadyTime{}, rng)) == Approx(40).margin(1e-6));
  p.jitter_ms = 30;
  SteadyTime last{};
  for (int i = 0; i < 1000; ++i) {
    const SteadyTime dep = t0 + i * 100us;
    const SteadyTime a = ArrivalTime(dep, p, last, rng);
    CHECK(a >= last);
    CHECK(Ms(dep, a) >= 10 - 1e-6);
    last = a;
  }
}

TEST_CASE("DecideDrop: loss fraction and partition", "[unit][net]") {
  std::mt19937_64 rng(3);
  LinkParams p;
  p.loss = 0.25;
  int lost = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) lost += DecideDrop(p, rng) == LinkDrop::kLoss;
  CHECK(lost / double(n) == Approx(0.25).margin(0.02));
  p.partitioned = true;
  CHECK(DecideDrop(p, rng) == LinkDrop::kPartition);
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

TEST_CASE("A 2 Gbit/s, 40 ms WAN link on one machine", "[net][shaper]") {
  LinkParams up = LinkParams::Wan(2, 40);
  ShapedPubSub t(up, 1, "inproc://wan");  // local mode: inproc under the link
  t.Sync();
  const auto start = Clock::now();
  for (int i = 1; i <= 4; ++i) {  // 4 x 4 MiB = 16.8 MB: 67 ms at 250 MB/s, plus 40 ms
    Message m = TestMessage("L", 1, i);
    m.AddOwned(std::vector<uint8_t>(4 << 20, 3));
    REQUIRE(t.pub->Publish("", m) == SendResult::kSent);
  }
  for (int i = 1; i <= 4; ++i) {
    Received r;
    REQUIRE(t.sub->Receive(&r, 5000) == RecvResult::kMessage);
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  CHECK(ms >= 100);
  CHECK(ms < 1500);
}

TEST_CASE("Shaped link: a heartbeat socket is not stuck behind a bulk transfer on the same link",
          "[net][shaper]") {
  auto ctx = MakeContext();
  std::shared_ptr<Link> link;
  LinkOptions lo;
  lo.up.bandwidth_bytes_per_s = 4 << 20;  // 4 MiB/s: the 2 MiB delta takes ~0.5 s
  REQUIRE(Link::Create(*ctx, lo, &link).ok());
  std::unique_ptr<SubChannel> data_in, beat_in;
  REQUIRE(SubChannel::Create(*ctx, Plain("syncer.uplink"), TestReceiveOptions(), &data_in).ok());
  REQUIRE(SubChannel::Create(*ctx, Plain("syncer.heartbeat"), TestReceiveOptions(), &beat_in).ok());
  REQUIRE(data_in->Bind("inproc://bulk").ok());
  REQUIRE(beat_in->Bind("inproc://beat").ok());
  REQUIRE(data_in->Subscribe("").ok());
  REQUIRE(beat_in->Subscribe("").ok());
  SocketOptions o = Plain("learner");
  o.link = link;
  std::unique_ptr<PubChannel> data_out, beat_out;
  REQUIRE(PubChannel::Create(*ctx, o, &data_out).ok());
  REQUIRE(PubChannel::Create(*ctx, o, &beat_out).ok());
  REQUIRE(data_out->Connect("inproc://bulk").ok());
  REQUIRE(beat_out->Connect("inproc://beat").ok());
  SyncPubSub(*data_out, *data_in, "");
  SyncPubSub(*beat_out, *beat_in, "");
  const auto start = Clock::now();
  Message delta = TestMessage("L", 1, 1);
  delta.AddOwned(std::vector<uint8_t>(2 << 20, 1));
  REQUIRE(data_out->Publish("", delta) == SendResult::kSent);
  Message beat = TestMessage("L", 1, 1);
  REQUIRE(beat_out->Publish("", beat) == SendResult::kSent);
  Received r;
  REQUIRE(beat_in->Receive(&r, 5000) == RecvResult::kMessage);
  const double beat_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  REQUIRE(data_in->Receive(&r, 5000) == RecvResult::kMessage);
  const double delta_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  CHECK(beat_ms < 200);     // its fair share: done long before the delta
  CHECK(delta_ms >= 450);   // 2 MiB at 4 MiB/s
  CHECK(beat_ms < delta_ms);
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

TEST_CASE("Link::Change applies one change to both directions, or none when it is invalid", "[net][shaper]") {
  auto ctx = MakeContext();
  std::shared_ptr<Link> link;
  LinkOptions lo;
  lo.name = "learner-1<->syncer";
  lo.up.latency_ms = 10;
  lo.down.latency_ms = 20;
  REQUIRE(Link::Create(*ctx, lo, &link).ok());
  REQUIRE(link->Change([](LinkParams* p) { p->loss = 0.25; }).ok());
  CHECK(link->params(LinkDirection::kUp).loss == 0.25);
  CHECK(link->params(LinkDirection::kDown).loss == 0.25);
  CHECK(link->params(LinkDirection::kUp).latency_ms == 10);  // the rest as each direction had it
  CHECK(link->params(LinkDirection::kDown).latency_ms == 20);
  const Status bad = link->Change([](LinkParams* p) { p->loss = 2; });
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Contains("learner-1<->syncer") && Catch::Contains("loss"));
  CHECK(link->params(LinkDirection::kUp).loss == 0.25);
  CHECK(link->params(LinkDirection::kDown).loss == 0.25);
}

}  // namespace
}  // namespace diloco::net
