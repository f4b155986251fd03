// CURVE keys and files, and CURVE + ZAP allowlists on live sockets.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "daemon/net/channel.h"
#include "daemon/net/context.h"
#include "daemon/net/curve.h"
#include "daemon/net/link_shaper.h"
#include "daemon/net/zap.h"
#include "tests/net/transport_test_util.h"
#include "tests/temp_dir.h"

namespace diloco::net {
namespace {

using namespace std::chrono_literals;
using testing::LogCapture;
using testing::MakeContext;
using testing::ProbeMessage;
using testing::TestMessage;
using testing::TestReceiveOptions;
using testing::WaitFor;

CurveKeyPair NewKeys() {
  CurveKeyPair k;
  REQUIRE(GenerateCurveKeyPair(&k).ok());
  return k;
}

TEST_CASE("libzmq has CURVE", "[unit][net]") { REQUIRE(CurveAvailable()); }

TEST_CASE("Key pairs: Z85 validation and public-from-secret", "[unit][net]") {
  const CurveKeyPair k = NewKeys();
  CHECK(k.public_z85.size() == 40);
  CHECK(ValidateZ85Key(k.public_z85, "k").ok());
  std::string pub;
  REQUIRE(CurvePublicFromSecret(k.secret_z85, &pub).ok());
  CHECK(pub == k.public_z85);
  CHECK_FALSE(ValidateZ85Key("short", "k").ok());
  CHECK_FALSE(ValidateZ85Key(std::string(40, '"'), "k").ok());  // '"' is not in the Z85 alphabet
  CHECK(NewKeys().public_z85 != k.public_z85);
}

TEST_CASE("Key files: 0600 secret, no overwrite without force, checked on load", "[unit][net]") {
  diloco::testing::TempDir tmp;
  const std::string dir = tmp.file("keys");
  const CurveKeyPair k = NewKeys();
  REQUIRE(WriteCurveKeyPair(dir, k, false).ok());
  struct stat st;
  REQUIRE(::stat((dir + "/key.secret").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CurveKeyPair loaded;
  REQUIRE(LoadCurveKeyPair(dir, &loaded).ok());
  CHECK(loaded.public_z85 == k.public_z85);
  CHECK(loaded.secret_z85 == k.secret_z85);

  const CurveKeyPair k2 = NewKeys();
  const Status again = WriteCurveKeyPair(dir, k2, false);
  CHECK_FALSE(again.ok());
  CHECK_THAT(again.message(), Catch::Contains("--force"));
  REQUIRE(LoadCurveKeyPair(dir, &loaded).ok());
  CHECK(loaded.public_z85 == k.public_z85);  // untouched
  REQUIRE(WriteCurveKeyPair(dir, k2, true).ok());
  REQUIRE(LoadCurveKeyPair(dir, &loaded).ok());
  CHECK(loaded.public_z85 == k2.public_z85);
  CHECK_FALSE(std::filesystem::exists(dir + "/key.secret.tmp"));

  ::chmod((dir + "/key.secret").c_str(), 0644);
  const Status loose = LoadCurveKeyPair(dir, &loaded);
  CHECK_FALSE(loose.ok());
  CHECK_THAT(loose.message(), Catch::Contains("chmod 600"));
  ::chmod((dir + "/key.secret").c_str(), 0600);
  tmp.Write("keys/key.public", k.public_z85 + "\n");  // not k2's public key
  CHECK_FALSE(LoadCurveKeyPair(dir, &loaded).ok());
  CHECK_FALSE(LoadCurveKeyPair(tmp.file("missing"), &loaded).ok());
}

TEST_CASE("DecideZap admits only allowlisted CURVE keys of the domain", "[unit][net]") {
  const std::map<std::string, std::set<std::string>> lists = {{"dilocod", {"KEY-A"}}, {"job9", {"KEY-B"}}};
  CHECK(DecideZap({"dilocod", "1.2.3.4", "CURVE", "KEY-A"}, lists).admit);
  CHECK_FALSE(DecideZap({"dilocod", "1.2.3.4", "CURVE", "KEY-B"}, lists).admit);
  CHECK(DecideZap({"job9", "1.2.3.4", "CURVE", "KEY-B"}, lists).admit);
  CHECK_FALSE(DecideZap({"other", "1.2.3.4", "CURVE", "KEY-A"}, lists).admit);
  CHECK_FALSE(DecideZap({"dilocod", "1.2.3.4", "NULL", ""}, lists).admit);
  CHECK_THAT(DecideZap({"dilocod", "", "CURVE", "X"}, lists).reason, Catch::Contains("not on the allowlist"));
}

SocketOptions CurveServer(const std::string& name, const CurveKeyPair& k) {
  SocketOptions o;
  o.name = name;
  o.linger_ms = 0;
  o.curve = CurveOptions{k.public_z85, k.secret_z85, true, "dilocod", ""};
  return o;
}
SocketOptions CurveClient(const std::string& name, const CurveKeyPair& k, const std::string& server_pub) {
  SocketOptions o;
  o.name = name;
  o.linger_ms = 0;
  o.reconnect_ivl_ms = 20;
  o.reconnect_ivl_max_ms = 100;
  o.curve = CurveOptions{k.public_z85, k.secret_z85, false, "", server_pub};
  return o;
}

TEST_CASE("CURVE PUB/SUB: allowlisted peer gets through; wrong keys are refused, logged, counted", "[net][curve]") {
  LogCapture logs;
  auto ctx = MakeContext();
  const CurveKeyPair server = NewKeys(), good = NewKeys(), intruder = NewKeys(), other_server = NewKeys();
  REQUIRE(ctx->SetAllowlist("dilocod", {good.public_z85}).ok());

  std::unique_ptr<SubChannel> sub;
  REQUIRE(SubChannel::Create(*ctx, CurveServer("syncer.uplink", server), TestReceiveOptions(), &sub).ok());
  REQUIRE(sub->Bind("tcp://127.0.0.1:*").ok());
  REQUIRE(sub->Subscribe("").ok());

  std::unique_ptr<PubChannel> pub_good, pub_bad, pub_wrong_server, pub_plain;
  REQUIRE(PubChannel::Create(*ctx, CurveClient("good", good, server.public_z85), &pub_good).ok());
  REQUIRE(PubChannel::Create(*ctx, CurveClient("intruder", intruder, server.public_z85), &pub_bad).ok());
  // Holds the wrong server key: the server cannot even read its HELLO.
  REQUIRE(PubChannel::Create(*ctx, CurveClient("lost", intruder, other_server.public_z85), &pub_wrong_server).ok());
  SocketOptions plain;
  plain.name = "plain";
  plain.allow_plaintext = true;
  plain.linger_ms = 0;
  REQUIRE(PubChannel::Create(*ctx, plain, &pub_plain).ok());
  REQUIRE(pub_bad->Connect(sub->endpoint()).ok());
  REQUIRE(pub_wrong_server->Connect(sub->endpoint()).ok());
  REQUIRE(pub_plain->Connect(sub->endpoint()).ok());
  REQUIRE(pub_good->Connect(sub->endpoint()).ok());

  // Everyone publishes; only the good peer's messages arrive.
  uint64_t seq = 0;
  int got = 0;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (got < 20 && std::chrono::steady_clock::now() < deadline) {
    for (PubChannel* p : {pub_bad.get(), pub_wrong_server.get(), pub_plain.get()}) {
      Message m = TestMessage("evil", 1, 1);
      p->Publish("", m);
    }
    Message m = TestMessage("learner-0", 1, ++seq);
    pub_good->Publish("", m);
    Received r;
    while (sub->Receive(&r, got == 0 ? 5 : 1) == RecvResult::kMessage) {
      REQUIRE(r.meta.sender == "learner-0");
      CHECK(r.peer_key == good.public_z85);  // the ZAP user id: the authenticated key
      ++got;
    }
  }
  CHECK(got >= 20);
  CHECK(WaitFor([&] {
    Received r;
    (void)sub->Receive(&r, 0);  // drains the server socket's handshake events
    return ctx->zap_refused_count(intruder.public_z85) >= 1 && sub->socket().stats().handshake_failures >= 2;
  }));
  CHECK(ctx->zap_stats().admitted >= 1);
  CHECK(ctx->zap_stats().refused >= 1);
  CHECK(logs.Contains("[net.zap] refused CURVE peer " + intruder.public_z85 + " from 127.0.0.1"));
  CHECK(logs.Contains("syncer.uplink: "));  // handshake failures of the wrong-server-key and plaintext peers

  CHECK(WaitFor([&] {
    Message m = TestMessage("evil", 1, 1);
    pub_bad->Publish("", m);  // drains the client's events: the server refused it
    return pub_bad->socket().stats().auth_failures >= 1;
  }));

  SECTION("allowlist changes apply to the next handshake") {
    REQUIRE(ctx->SetAllowlist("dilocod", {good.public_z85, intruder.public_z85}).ok());
    // libzmq does not retry a refused connection by itself: the client connects again.
    pub_bad.reset();
    REQUIRE(PubChannel::Create(*ctx, CurveClient("intruder", intruder, server.public_z85), &pub_bad).ok());
    REQUIRE(pub_bad->Connect(sub->endpoint()).ok());
    bool intruder_in = false;
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!intruder_in && std::chrono::steady_clock::now() < until) {
      Message m = TestMessage("now-allowed", 1, 1);
      pub_bad->Publish("", m);
      Received r;
      if (sub->Receive(&r, 10) == RecvResult::kMessage && r.meta.sender == "now-allowed") intruder_in = true;
    }
    CHECK(intruder_in);
  }
}

TEST_CASE("CURVE ROUTER/DEALER: the good learner is served while an intruder is refused", "[net][curve]") {
  LogCapture logs;
  auto ctx = MakeContext();
  const CurveKeyPair server = NewKeys(), good = NewKeys(), intruder = NewKeys();
  REQUIRE(ctx->SetAllowlist("dilocod", {good.public_z85}).ok());
  std::unique_ptr<RouterChannel> router;
  REQUIRE(RouterChannel::Create(*ctx, CurveServer("syncer.snapshot", server), TestReceiveOptions(), &router).ok());
  REQUIRE(router->Bind("tcp://127.0.0.1:*").ok());
  std::unique_ptr<DealerChannel> dealer_good, dealer_bad;
  SocketOptions go = CurveClient("learner.snapshot", good, server.public_z85);
  go.routing_id = "learner-1";
  REQUIRE(DealerChannel::Create(*ctx, go, TestReceiveOptions(), &dealer_good).ok());
  REQUIRE(DealerChannel::Create(*ctx, CurveClient("intruder", intruder, server.public_z85), TestReceiveOptions(),
                                &dealer_bad).ok());
  REQUIRE(dealer_bad->Connect(router->endpoint()).ok());
  REQUIRE(dealer_good->Connect(router->endpoint()).ok());
  Message bad_req = TestMessage("intruder", 1, 1);
  CHECK(dealer_bad->Send(bad_req, 0) != SendResult::kClosed);  // queued (or refused at HWM): never delivered
  for (int i = 1; i <= 5; ++i) {
    Message req = TestMessage("learner-1", 1, i);
    REQUIRE(dealer_good->Send(req, 2000) == SendResult::kSent);
    Received r;
    REQUIRE(router->Receive(&r, 5000) == RecvResult::kMessage);
    CHECK(r.peer == "learner-1");
    CHECK(r.peer_key == good.public_z85);
    Message reply = TestMessage("syncer", 1, i, "snapshot part");
    REQUIRE(router->SendTo(r.peer, reply) == SendResult::kSent);
    Received back;
    REQUIRE(dealer_good->Receive(&back, 5000) == RecvResult::kMessage);
    CHECK(back.message.frame_view(1) == "snapshot part");
  }
  CHECK(WaitFor([&] { return ctx->zap_refused_count(intruder.public_z85) >= 1; }));
  CHECK(logs.Contains(intruder.public_z85));
  Received r;
  CHECK(router->Receive(&r, 50) == RecvResult::kTimeout);  // the intruder's request never arrived
}

TEST_CASE("CURVE through a shaped link: the relay carries the app's keys", "[net][curve][shaper]") {
  auto ctx = MakeContext();
  const CurveKeyPair server = NewKeys(), good = NewKeys();
  REQUIRE(ctx->SetAllowlist("dilocod", {good.public_z85}).ok());
  std::shared_ptr<Link> link;
  LinkOptions lo;
  lo.up.latency_ms = 5;
  REQUIRE(Link::Create(*ctx, lo, &link).ok());
  std::unique_ptr<SubChannel> sub;
  REQUIRE(SubChannel::Create(*ctx, CurveServer("syncer.uplink", server), TestReceiveOptions(), &sub).ok());
  REQUIRE(sub->Bind("tcp://127.0.0.1:*").ok());
  REQUIRE(sub->Subscribe("").ok());
  SocketOptions po = CurveClient("learner.uplink", good, server.public_z85);
  po.link = link;
  std::unique_ptr<PubChannel> pub;
  REQUIRE(PubChannel::Create(*ctx, po, &pub).ok());
  REQUIRE(pub->Connect(sub->endpoint()).ok());
  testing::SyncPubSub(*pub, *sub, "");
  Message m = TestMessage("learner-0", 1, 1);
  REQUIRE(pub->Publish("", m) == SendResult::kSent);
  Received r;
  REQUIRE(sub->Receive(&r, 5000) == RecvResult::kMessage);
  CHECK(r.peer_key == good.public_z85);
}

}  // namespace
}  // namespace diloco::net
