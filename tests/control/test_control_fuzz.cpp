// Fuzz of the control protocol against real daemons: random, mutated and hostile requests on a
// daemon's local ipc socket (as any local user) and on its peer socket (as an allowlisted peer
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
#include "tests/control/daemon_testing.h"

namespace diloco {
using namespace testing;
namespace {

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

class ControlFuzzer {
 public:
  ControlFuzzer(uint64_t seed, std::vector<std::string> jobs, std::string yaml) : rng_(seed), jobs_(std::move(jobs)), yaml_(std::move(yaml)) {}

  // One request as frames: mostly well-formed envelopes with hostile contents, some with their
  // bytes mutated, some raw garbage.
  net::Message Next(const std::string& sender) {
    const uint64_t kind = Pick(100);
    if (kind < 8) return Raw();
    EnvelopeHeader h;
    h.job_id = Pick(3) == 0 ? RandomText(Pick(40)) : Pick(2) ? Job() : kNoJob;
    if (!IsIdentifierLike(h.job_id)) h.job_id = "x";
    h.sender = sender;
    h.seq = rng_();
    h.incarnation = rng_();
    h.sent_unix_ms = rng_();
    MessageBody body;
    if (Pick(10) == 0) {
      body = JobSpecMsg{Yaml()};
    } else {
      ControlArgs args;
      for (uint64_t i = 0, n = Pick(6); i < n; i++) args[Key()] = Value();
      body = MakeControl(Name(), args, rng_());
    }
    OutgoingMessage om;
    if (!BuildMessage(h, body, {}, &om).ok()) return Raw();
    net::Message m = net::ToMessage(std::move(om), nullptr);
    if (kind < 25) Mutate(&m);
    return m;
  }

 private:
  uint64_t Pick(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  static bool IsIdentifierLike(const std::string& s) {
    if (s.empty()) return false;
    for (char c : s)
      if (c <= 0x20 || c > 0x7e) return false;
    return true;
  }
  std::string RandomText(size_t n) {
    std::string s(n, ' ');
    for (char& c : s) c = (char)Pick(256);
    return s;
  }
  std::string Job() { return jobs_.empty() || Pick(4) == 0 ? "20260101-000000-0000" : jobs_[Pick(jobs_.size())]; }
  std::string Name() {
    static const char* names[] = {"ping", "submit", "list", "status", "logs", "run_dir", "chaos", "stop",
                                  "peer_status", "peer_logs", "peer_chaos", "peer_rejoin", "peer_stop", "nonsense", ""};
    return names[Pick(sizeof names / sizeof *names)];
  }
  std::string Key() {
    static const char* keys[] = {"tail", "offset", "bytes", "config_yaml", "overrides", "source", "base_dir", "action",
                                 "site", "learner", "syncer", "process", "value", "duration_s", "restart_after_s", "json"};
    return Pick(8) == 0 ? RandomText(Pick(12)) : keys[Pick(sizeof keys / sizeof *keys)];
  }
  std::string Value() {
    static const char* values[] = {"-1", "0", "1", "-2147483648", "2147483647", "99999999999999999999", "1e308",
                                   "nan", "inf", "-inf", "abc", "", "site-a", "site-b", "site-s", "kill", "slow",
                                   "partition", "[1,2]", "{\"roles\": 3}", "\xff\xfe", "../../../etc/passwd"};
    const uint64_t k = Pick(10);
    if (k == 0) return Yaml();
    if (k == 1) return RandomText(Pick(2000));
    if (k == 2) return std::string(Pick(60000), 'y');
    return values[Pick(sizeof values / sizeof *values)];
  }
  // The test job's YAML with a few bytes changed, lines dropped or nonsense appended.
  std::string Yaml() {
    std::string y = yaml_;
    for (uint64_t i = 0, n = Pick(4); i < n && !y.empty(); i++) y[Pick(y.size())] = (char)Pick(256);
    if (Pick(3) == 0) y += "train: {steps: " + Value() + "}\n";
    if (Pick(4) == 0) y += "data: {corpus: " + Value() + "}\n";
    if (Pick(5) == 0) y = y.substr(0, Pick(y.size() + 1));
    return y;
  }
  net::Message Raw() {
    net::Message m;
    for (uint64_t i = 0, n = 1 + Pick(4); i < n; i++) {
      const std::string bytes = RandomText(Pick(300));
      m.AddFrame(zmq::message_t(bytes.data(), bytes.size()));
    }
    return m;
  }
  void Mutate(net::Message* m) {
    net::Message out;
    for (size_t f = 0; f < m->size(); f++) {
      std::string bytes(m->frame_view(f));
      for (uint64_t i = 0, n = 1 + Pick(8); i < n && !bytes.empty(); i++) bytes[Pick(bytes.size())] = (char)Pick(256);
      if (Pick(4) == 0) bytes.resize(Pick(bytes.size() + 1));
      out.AddFrame(zmq::message_t(bytes.data(), bytes.size()));
    }
    *m = std::move(out);
  }

  std::mt19937_64 rng_;
  std::vector<std::string> jobs_;
  std::string yaml_;
};

// Sends each request on its own connection half the time (fresh identities), drains replies.
void Flood(net::NetContext& context, const net::SocketOptions& so, const std::string& endpoint, ControlFuzzer& fz,
           const std::string& sender, uint64_t n) {
  net::ReceiveOptions ro;
  ro.track_sequence = false;
  ro.validator = net::EnvelopeValidator(ControlParseOptions(), std::make_shared<ParsedMessage>());
  std::unique_ptr<net::DealerChannel> dealer;
  for (uint64_t i = 0; i < n; i++) {
    if (!dealer || i % 2 == 0) {
      dealer.reset();
      REQUIRE(net::DealerChannel::Create(context, so, ro, &dealer).ok());
      REQUIRE(dealer->Connect(endpoint).ok());
    }
    net::Message m = fz.Next(sender);
    (void)dealer->Send(m, 200);
    net::Received r;
    while (dealer->Receive(&r, i % 50 == 0 ? 100 : 0) == net::RecvResult::kMessage) {
    }
  }
}

}  // namespace

TEST_CASE("fuzz: hostile control requests on the local and peer sockets never take a daemon down", "[e2e][fuzz]") {
  const uint64_t iterations = EnvOr("DILOCO_FUZZ_ITERATIONS", 3000);
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string yaml = JobYaml(200000);
  const std::string job = Submit(dir, *c, 200000);
  ControlFuzzer fz(EnvOr("DILOCO_FUZZ_SEED", 20261204), {job}, yaml);
  std::unique_ptr<net::NetContext> context;
  REQUIRE(net::NetContext::Create({}, &context).ok());

  // The local socket, as the CLI would (plaintext ipc).
  net::SocketOptions local;
  local.name = "fuzz.local";
  local.allow_plaintext = true;
  local.linger_ms = 0;
  const auto t0 = Clock::now();
  Flood(*context, local, "ipc://" + c->SocketPath("site-a"), fz, "dilococtl", iterations / 2);
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
