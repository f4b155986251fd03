// Helpers of the daemon tests: a local cluster of real dilocod processes (LocalCluster), the real
// dilococtl binary, a tiny two-learner job, and waits on a job's status.
#pragma once

#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "daemon/control/client.h"
#include "daemon/control/local_cluster.h"
#include "daemon/net/curve.h"
#include "daemon/net/envelope.h"
#include "daemon/net/socket.h"
#include "daemon/net/wire_transport.h"
#include "tests/temp_dir.h"

namespace diloco::testing {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;


inline const std::string kBin = DILOCO_BINARY_DIR "/bin/";

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct CtlResult {
  int exit_code;
  std::string out, err;
};

// Runs dilococtl with args (already shell-quoted).
inline CtlResult Ctl(const testing::TempDir& dir, const std::string& args) {
  const std::string cmd =
      kBin + "dilococtl " + args + " > '" + dir.file("ctl.out") + "' 2> '" + dir.file("ctl.err") + "'";
  const int rc = std::system(cmd.c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, ReadFile(dir.file("ctl.out")), ReadFile(dir.file("ctl.err"))};
}

// A tiny two-learner job: learners on site-a and site-b, the syncer on site-s.
inline std::string JobYaml(int steps, int checkpoint_every = 1) {
  return "model: {n_layer: 2, n_embd: 32, n_head: 4, block_size: 32}\n"
         "data: {corpus: /usr/share/games/fortunes}\n"  // installed by scripts/setup.sh
         "train: {batch_size: 4, steps: " +
         std::to_string(steps) +
         ", lr: 1.0e-3, warmup_steps: 5, seed: 1337, log_every: 50}\n"
         "eval: {batches: 2}\n"
         "sync: {mode: decoupled, learners: 2, fragments: 4, inner_steps: 10, quorum: 1, checkpoint_every: " +
         std::to_string(checkpoint_every) + "}\n"
         "placement: {syncer: site-s, learners: [site-a, site-b]}\n";
}

inline bool IsJobIdLike(const std::string& id) { return !id.empty() && id.find(' ') == std::string::npos; }

// GET http://127.0.0.1:port/metrics: the body ("" when it fails).
inline std::string HttpGetMetrics(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    (void)!::write(fd, request.data(), request.size());
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) response.append(buf, n);
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

inline std::unique_ptr<LocalCluster> StartCluster(const testing::TempDir& dir, bool metrics = false, bool chaos = false,
                                                  std::vector<std::string> data_roots = {"/usr/share/games"}) {
  LocalClusterOptions o;
  o.data_roots = std::move(data_roots);
  o.metrics = metrics;
  o.chaos = chaos;
  o.dir = dir.file("cluster");
  o.sites = {"site-s", "site-a", "site-b"};
  o.dilocod_path = kBin + "dilocod";
  std::unique_ptr<LocalCluster> c;
  REQUIRE(LocalCluster::Create(o, &c).ok());
  const Status st = c->StartAll();
  INFO(st.message());
  REQUIRE(st.ok());
  return c;
}

inline std::string Submit(const testing::TempDir& dir, LocalCluster& c, int steps, int checkpoint_every = 1) {
  const std::string job = dir.Write("job.yaml", JobYaml(steps, checkpoint_every));
  const CtlResult r = Ctl(dir, "submit '" + job + "' --socket '" + c.SocketPath("site-a") + "'");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::string id = r.out.substr(0, r.out.find('\n'));
  REQUIRE(IsJobIdLike(id));
  return id;
}

// A 3000-step job whose learners run `slowdown` times slower than they can (at 8 it trains for
// minutes; the test stops it), submitted on site-a; its id.
inline std::string SubmitPaced(const testing::TempDir& dir, LocalCluster& c, int slowdown = 8) {
  const std::string n = std::to_string(slowdown);
  const std::string yaml =
      dir.Write("paced.yaml", JobYaml(3000) + "learners: [{slowdown: " + n + "}, {slowdown: " + n + "}]\n");
  const CtlResult r = Ctl(dir, "submit '" + yaml + "' --socket '" + c.SocketPath("site-a") + "'");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return r.out.substr(0, r.out.find('\n'));
}

// Polls the job's status (through site's daemon) until pred holds; fails after timeout_s.
inline nlohmann::json WaitStatus(LocalCluster& c, const std::string& site, const std::string& job,
                          const std::function<bool(const nlohmann::json&)>& pred, double timeout_s,
                          const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::milliseconds((int64_t)(timeout_s * 1000));
  nlohmann::json s;
  for (;;) {
    Status st = CallDaemonJson(c.SocketPath(site), "status", job, {}, &s, 5000);
    if (st.ok() && pred(s)) return s;
    if (Clock::now() > deadline) {
      FAIL("timed out waiting for " << what << "; last status: " << (st.ok() ? s.dump() : st.message())
                                    << "\nsite-s log:\n" << TailFile(c.LogPath("site-s"), 15));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

inline long LearnerStep(const nlohmann::json& s, int i) {
  const nlohmann::json& l = s["learners"][i];
  if (l.contains("progress")) return l["progress"].value("step", 0L);
  if (l.contains("result")) return l["result"].value("steps", 0L);
  return -1;
}

inline std::vector<uint64_t> Versions(const nlohmann::json& s) {
  // A syncer role that is (re)starting reports {"phase": "starting"} and no versions yet. (A
  // const operator[] on a missing key is undefined: it once read a number here.)
  if (!s.contains("syncer") || !s["syncer"].contains("progress")) return {};
  const nlohmann::json& progress = s["syncer"]["progress"];
  if (!progress.is_object() || !progress.contains("versions") || !progress["versions"].is_array()) return {};
  return progress["versions"].get<std::vector<uint64_t>>();
}

inline bool Completed(const nlohmann::json& s) { return s.value("state", "") == "completed" && s.contains("summary"); }

// Merge events in the syncer's events.log.
inline std::vector<nlohmann::json> Merges(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run_dir + "/events.log");
  for (std::string line; std::getline(f, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == "merge") out.push_back(j);
  }
  return out;
}

inline bool MergedFrom(const nlohmann::json& merge, int learner) {
  for (const auto& c : merge.value("contributors", nlohmann::json::array()))
    if (c.value("learner", -1) == learner) return true;
  return false;
}


// A process's resident memory, MiB (0 when it cannot be read).
inline double RssMiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024;
  return 0;
}

// Socket options of a client that holds site `as`'s real keys and talks to site `to` (CURVE).
inline net::SocketOptions SiteClient(LocalCluster& c, const std::string& as, const std::string& to,
                                     const std::string& name) {
  net::CurveKeyPair mine, theirs;
  REQUIRE(net::LoadCurveKeyPair(c.SiteDir(as) + "/keys", &mine).ok());
  REQUIRE(net::LoadCurveKeyPair(c.SiteDir(to) + "/keys", &theirs).ok());
  net::SocketOptions so;
  so.name = name;
  so.linger_ms = 0;
  so.curve = net::CurveOptions{mine.public_z85, mine.secret_z85, false, "dilocod", theirs.public_z85};
  return so;
}

// A message of the data protocol as any sender may forge it.
inline net::Message Forged(const std::string& job, const std::string& sender, uint64_t seq, uint64_t incarnation,
                           const MessageBody& body) {
  EnvelopeHeader h;
  h.job_id = job;
  h.sender = sender;
  h.seq = seq;
  h.incarnation = incarnation;
  h.sent_unix_ms = (uint64_t)UnixMs();
  OutgoingMessage om;
  REQUIRE(BuildMessage(h, body, {}, &om).ok());
  return net::ToMessage(std::move(om), nullptr);
}

}  // namespace diloco::testing
