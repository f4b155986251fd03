// Hostile control requests for the daemon tests (test_control_fuzz.cpp, test_hostile_bench.cpp):
// well-formed envelopes with hostile contents, mutated bytes and raw garbage.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/control/control_protocol.h"
#include "daemon/net/channel.h"
#include "daemon/net/envelope.h"
#include "daemon/net/local_socket.h"
#include "daemon/net/wire_transport.h"

namespace diloco::testing {

inline uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

class ControlFuzzer {
 public:
  // protect_jobs: stop, peer_stop and peer_rejoin only ever name made-up jobs (a benchmark that
  // checks the job keeps training).
  ControlFuzzer(uint64_t seed, std::vector<std::string> jobs, std::string yaml, bool protect_jobs = false)
      : rng_(seed), jobs_(std::move(jobs)), yaml_(std::move(yaml)), protect_jobs_(protect_jobs) {}

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
      const std::string name = Name();
      if (protect_jobs_ && (name == "stop" || name == "peer_stop" || name == "peer_rejoin")) h.job_id = "20260101-000000-0000";
      body = MakeControl(name, args, rng_());
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
  bool protect_jobs_ = false;
};

// Sends each request on its own connection half the time (fresh identities), drains replies.
inline void Flood(net::NetContext& context, const net::SocketOptions& so, const std::string& endpoint, ControlFuzzer& fz,
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

// The same on a daemon's local control socket (net/local_socket.h): a connection the daemon
// closed (after a request it refused) is replaced by a new one.
inline void FloodLocal(const std::string& path, ControlFuzzer& fz, const std::string& sender, uint64_t n) {
  std::unique_ptr<net::LocalClient> client;
  for (uint64_t i = 0; i < n; i++) {
    if (!client || i % 2 == 0) {
      client.reset();
      REQUIRE(net::LocalClient::Connect(path, 2000, &client).ok());
    }
    net::Message m = fz.Next(sender);
    if (!client->Send(m, 200).ok()) {
      client.reset();
      continue;
    }
    net::Message reply;
    const Status st = client->Receive(&reply, i % 50 == 0 ? 100 : 0);
    if (!st.ok() && st.message().find("closed the connection") != std::string::npos) client.reset();
  }
}

// A request that never ends, on a daemon's local control socket: a prefix announcing a request of
// cap bytes (the daemon's cap: 2 MiB), then up to total_bytes more, 1 MiB at a time, until the
// daemon cuts it off. Returns the bytes written (what the kernel's socket buffers took included;
// 0: no connection). No Catch assertions: attackers run on threads of their own.
inline uint64_t NeverEndingRequest(const std::string& path, uint64_t total_bytes, uint64_t cap = uint64_t{2} << 20) {
  std::unique_ptr<net::LocalClient> c;
  if (!net::LocalClient::Connect(path, 2000, &c).ok()) return 0;
  std::vector<uint8_t> prefix(std::begin(net::kStreamMagic), std::end(net::kStreamMagic));
  for (uint32_t v : {uint32_t{1}, (uint32_t)(cap - net::kStreamFixedPrefixBytes - 4)})
    for (int i = 0; i < 4; i++) prefix.push_back((uint8_t)(v >> (8 * i)));
  if (!c->WriteAll(prefix, 2000).ok()) return 0;
  uint64_t written = prefix.size();
  const std::vector<uint8_t> mib(1 << 20, 0xab);
  while (written < total_bytes && c->WriteAll(mib, 5000).ok()) written += mib.size();
  return written;
}

}  // namespace diloco::testing
