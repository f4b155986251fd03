// The hostile-peer benchmark (scripts/bench/hostile.sh; hidden from the default test run): for
// DILOCO_HOSTILE_SECONDS (default 600), a 3-daemon cluster training a job takes, in turns, fuzzed
// control requests on every daemon's local and peer sockets, snapshot floods as a learner, forged
// learner messages with another site's key, raw garbage at the uplink and snapshot sockets,
// plaintext clients at CURVE sockets, and a downlink subscriber that never reads. It prints one
// table: each daemon's RSS at the start, the end and its peak, the requests of each kind, and the
// steps the job made; it checks 0 crashes, 0 hangs (every daemon answers ping within 2 s
// throughout), the job keeps training, and each RSS stays within +64 MiB of its start.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <map>

#include "daemon/config/daemon_config.h"
#include "daemon/net/curve.h"
#include "tests/control/control_fuzzer.h"
#include "tests/control/daemon_testing.h"

namespace diloco {
using namespace testing;
namespace {

net::Message Garbage(std::mt19937_64& rng) {
  net::Message m;
  for (int f = 0, n = 1 + (int)(rng() % 3); f < n; f++) {
    std::string bytes(rng() % 512, ' ');
    for (char& ch : bytes) ch = (char)rng();
    m.AddFrame(zmq::message_t(bytes.data(), bytes.size()));
  }
  return m;
}

}  // namespace

TEST_CASE("hostile: ten minutes of fuzz and floods at every socket of a training cluster", "[.hostile]") {
  const double seconds = (double)EnvOr("DILOCO_HOSTILE_SECONDS", 600);
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string job = Submit(dir, *c, 50000000);
  WaitStatus(*c, "site-a", job, [](const nlohmann::json& s) { return LearnerStep(s, 1) > 100; }, 60, "training");
  std::this_thread::sleep_for(std::chrono::seconds(3));  // past start-up allocations

  std::map<std::string, DaemonConfig> cfg;
  for (const std::string& site : c->sites()) REQUIRE(LoadDaemonConfig(c->ConfigPath(site), &cfg[site]).ok());
  std::map<std::string, double> rss_start, rss_peak, rss_end;
  for (const std::string& site : c->sites()) rss_start[site] = rss_peak[site] = RssMiB(c->pid(site));
  std::unique_ptr<net::NetContext> context;
  REQUIRE(net::NetContext::Create({}, &context).ok());
  auto client = [&](const std::string& as, const std::string& to) {
    net::SocketOptions so = SiteClient(*c, as, to, "hostile");
    so.recv_hwm_msgs = 1;
    return so;
  };
  net::ReceiveOptions ro;
  ro.track_sequence = false;
  ro.validator = net::EnvelopeValidator(ParseOptions(), std::make_shared<ParsedMessage>());
  // A downlink subscriber that never reads, for the whole run.
  std::unique_ptr<net::SubChannel> lazy;
  REQUIRE(net::SubChannel::Create(*context, client("site-a", "site-s"), ro, &lazy).ok());
  REQUIRE(lazy->Subscribe("").ok());
  REQUIRE(lazy->Connect(ConnectableEndpoint(cfg["site-s"].listen.downlink)).ok());

  ControlFuzzer fz(EnvOr("DILOCO_FUZZ_SEED", 20261204), {job}, JobYaml(10), /*protect_jobs=*/true);
  std::mt19937_64 rng(EnvOr("DILOCO_FUZZ_SEED", 20261204));
  std::map<std::string, uint64_t> sent;
  uint64_t seq = 0;
  const long steps_before = LearnerStep([&] {
    nlohmann::json s;
    REQUIRE(CallDaemonJson(c->SocketPath("site-a"), "status", job, {}, &s, 5000).ok());
    return s;
  }(), 0);
  const auto t0 = Clock::now();
  auto last_check = t0;
  bool hung = false;
  for (int round = 0; std::chrono::duration<double>(Clock::now() - t0).count() < seconds; round++) {
    const std::string& site = c->sites()[round % c->sites().size()];
    switch (round % 6) {
      case 0: {  // fuzzed control requests on the local socket, and one that never ends
        FloodLocal(c->SocketPath(site), fz, "dilococtl", 100);
        sent["control, local socket"] += 100;
        (void)NeverEndingRequest(c->SocketPath(site), uint64_t{16} << 20);
        sent["control, local socket: a request that never ends (16 MiB)"] += 1;
        break;
      }
      case 1: {  // fuzzed control requests on the peer socket, as another site
        const std::string as = site == "site-a" ? "site-b" : "site-a";
        Flood(*context, client(as, site), cfg[site].listen.control, fz, as, 100);
        sent["control, peer socket (a site's key)"] += 100;
        break;
      }
      case 2: {  // snapshot requests as learner-1 with its own site's key, never read
        std::unique_ptr<net::DealerChannel> d;
        REQUIRE(net::DealerChannel::Create(*context, client("site-b", "site-s"), ro, &d).ok());
        REQUIRE(d->Connect(ConnectableEndpoint(cfg["site-s"].listen.snapshot)).ok());
        for (int i = 0; i < 50; i++) {
          SnapshotRequestMsg rq;
          rq.request_id = ++seq;
          net::Message m = Forged(job, "learner-1", seq, 1, rq);
          (void)d->Send(m, 50);
        }
        sent["snapshot requests, never read"] += 50;
        break;
      }
      case 3: {  // forged learner-1 heartbeats and deltas' garbage with site-a's key, on the uplink
        std::unique_ptr<net::PubChannel> pub;
        REQUIRE(net::PubChannel::Create(*context, client("site-a", "site-s"), &pub).ok());
        REQUIRE(pub->Connect(ConnectableEndpoint(cfg["site-s"].listen.uplink)).ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        for (int i = 0; i < 100; i++) {
          HeartbeatMsg hb;
          hb.state = LearnerState::kFinished;
          net::Message m = i % 2 ? Forged(job, "learner-1", ++seq, 1, hb) : Garbage(rng);
          (void)pub->Publish(job, m);
        }
        sent["uplink: forged and garbage"] += 100;
        break;
      }
      case 4: {  // raw garbage at the snapshot ROUTER
        std::unique_ptr<net::DealerChannel> d;
        REQUIRE(net::DealerChannel::Create(*context, client("site-a", "site-s"), ro, &d).ok());
        REQUIRE(d->Connect(ConnectableEndpoint(cfg["site-s"].listen.snapshot)).ok());
        for (int i = 0; i < 100; i++) {
          net::Message m = Garbage(rng);
          (void)d->Send(m, 50);
        }
        sent["snapshot socket: garbage"] += 100;
        break;
      }
      case 5: {  // plaintext clients at a CURVE control socket (the handshake must fail)
        net::SocketOptions plain;
        plain.name = "hostile.plain";
        plain.allow_plaintext = true;
        plain.linger_ms = 0;
        std::unique_ptr<net::DealerChannel> d;
        if (net::DealerChannel::Create(*context, plain, ro, &d).ok() && d->Connect(cfg[site].listen.control).ok()) {
          net::Message m = Garbage(rng);
          (void)d->Send(m, 50);
        }
        sent["plaintext at CURVE sockets"] += 1;
        break;
      }
    }
    if (Clock::now() - last_check > std::chrono::seconds(5)) {
      last_check = Clock::now();
      for (const std::string& s : c->sites()) {
        REQUIRE(c->Running(s));
        ControlArgs reply;
        if (!CallDaemon(c->SocketPath(s), "ping", kNoJob, {}, &reply, 2000).ok()) hung = true;
        rss_peak[s] = std::max(rss_peak[s], RssMiB(c->pid(s)));
      }
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  nlohmann::json s;
  REQUIRE(CallDaemonJson(c->SocketPath("site-a"), "status", job, {}, &s, 5000).ok());
  const long steps_after = LearnerStep(s, 0);
  std::printf("\nhostile bench: %.0f s, job %s\n\n| daemon | RSS start MiB | RSS end MiB | peak MiB | growth MiB |\n| --- | ---: | ---: | ---: | ---: |\n",
              seconds, job.c_str());
  for (const std::string& site : c->sites()) {
    REQUIRE(c->Running(site));
    rss_end[site] = RssMiB(c->pid(site));
    rss_peak[site] = std::max(rss_peak[site], rss_end[site]);
    std::printf("| %s | %.1f | %.1f | %.1f | %+.1f |\n", site.c_str(), rss_start[site], rss_end[site], rss_peak[site],
                rss_end[site] - rss_start[site]);
  }
  std::printf("\n| attack | sent |\n| --- | ---: |\n");
  for (const auto& [kind, n] : sent) std::printf("| %s | %llu |\n", kind.c_str(), (unsigned long long)n);
  std::printf("\nlearner-0 steps: %ld -> %ld; job state %s; hangs: %s\n", steps_before, steps_after,
              s.value("state", "?").c_str(), hung ? "yes" : "none");
  CHECK_FALSE(hung);
  CHECK(steps_after > steps_before);
  CHECK(s.value("state", "") == "running");
  for (const std::string& site : c->sites()) CHECK(rss_end[site] - rss_start[site] < 64);
  (void)Ctl(dir, "stop " + job + " --socket '" + c->SocketPath("site-a") + "'");
}

}  // namespace diloco
