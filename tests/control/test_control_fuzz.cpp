// Fuzz of the control protocol against real daemons: random, mutated and hostile requests on a
// daemon's local socket (as any local user) and on its peer socket (as an allowlisted peer
// holding a real site key). Every daemon must stay up and keep answering, and the job that was
// running must be unharmed unless a fuzzed request stopped it. DILOCO_FUZZ_ITERATIONS scales it
// (default 3000 requests; CI runs it under ASan + UBSan too); DILOCO_FUZZ_SEED picks the inputs.
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>

#include "daemon/config/daemon_config.h"
#include "daemon/control/control_protocol.h"
#include "daemon/net/channel.h"
#include "daemon/net/curve.h"
#include "daemon/net/envelope.h"
#include "daemon/net/wire_transport.h"
#include "tests/control/control_fuzzer.h"
#include "tests/control/daemon_testing.h"

namespace diloco {
using namespace testing;

TEST_CASE("fuzz: hostile control requests on the local and peer sockets never take a daemon down", "[e2e][fuzz]") {
  const uint64_t iterations = EnvOr("DILOCO_FUZZ_ITERATIONS", 3000);
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string yaml = JobYaml(200000);
  const std::string job = Submit(dir, *c, 200000);
  ControlFuzzer fz(EnvOr("DILOCO_FUZZ_SEED", 20261204), {job}, yaml);
  std::unique_ptr<net::NetContext> context;
  REQUIRE(net::NetContext::Create({}, &context).ok());

  // The local socket, as the CLI would.
  const auto t0 = Clock::now();
  FloodLocal(c->SocketPath("site-a"), fz, "dilococtl", iterations / 2);
  // The peer socket of site-s, as site-b (its real key: past CURVE and the sender check).
  DaemonConfig s_cfg;
  REQUIRE(LoadDaemonConfig(c->ConfigPath("site-s"), &s_cfg).ok());
  net::CurveKeyPair b_keys, s_keys;
  REQUIRE(net::LoadCurveKeyPair(c->SiteDir("site-b") + "/keys", &b_keys).ok());
  REQUIRE(net::LoadCurveKeyPair(c->SiteDir("site-s") + "/keys", &s_keys).ok());
  net::SocketOptions peer;
  peer.name = "fuzz.peer";
  peer.linger_ms = 0;
  peer.curve = net::CurveOptions{b_keys.public_z85, b_keys.secret_z85, false, "dilocod", s_keys.public_z85};
  Flood(*context, peer, s_cfg.listen.control, fz, "site-b", iterations - iterations / 2);
  std::printf("control fuzz: %llu requests in %.1f s\n", (unsigned long long)iterations,
              std::chrono::duration<double>(Clock::now() - t0).count());

  for (const std::string& site : c->sites()) {
    INFO(site << " log:\n" << TailFile(c->LogPath(site), 30));
    REQUIRE(c->Running(site));
    ControlArgs reply;
    CHECK(CallDaemon(c->SocketPath(site), "ping", kNoJob, {}, &reply, 5000).ok());
  }
  // The job is still known everywhere (running, or stopped by a fuzzed stop).
  nlohmann::json s;
  REQUIRE(CallDaemonJson(c->SocketPath("site-a"), "status", job, {}, &s, 5000).ok());
  CHECK(s.value("id", "") == job);
  (void)Ctl(dir, "stop " + job + " --socket '" + c->SocketPath("site-a") + "'");
}

}  // namespace diloco
