// The daemon's control loop never waits on a peer or on a role's start-up: a hung peer delays
// only the requests that need it, a syncer that cannot bind yet leaves the daemon answering.
#include <signal.h>

#include <future>
#include <regex>

#include "daemon/control/off_loop.h"
#include "tests/control/daemon_testing.h"

namespace diloco {
namespace {

using namespace testing;

int64_t MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// The slowest of `n` pings to a daemon, one every 100 ms.
int64_t SlowestPingMs(const std::string& socket, int n) {
  int64_t slowest = 0;
  for (int i = 0; i < n; i++) {
    ControlArgs reply;
    const auto t0 = Clock::now();
    const Status st = CallDaemon(socket, "ping", kNoJob, {}, &reply, 5000);
    INFO(st.message());
    CHECK(st.ok());
    slowest = std::max(slowest, MsSince(t0));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return slowest;
}

struct Timed {
  Status status;
  ControlArgs reply;
  int64_t ms = 0;
};
std::future<Timed> CallAsync(const std::string& socket, const std::string& name, const std::string& job, ControlArgs args) {
  return std::async(std::launch::async, [=] {
    Timed t;
    const auto t0 = Clock::now();
    t.status = CallDaemon(socket, name, job, args, &t.reply, 20000);
    t.ms = MsSince(t0);
    return t;
  });
}

// The syncer's progress in a job status ({} when the status has none).
nlohmann::json SyncerProgress(const nlohmann::json& s) {
  if (!s.contains("syncer") || !s["syncer"].is_object() || !s["syncer"].contains("progress")) return nlohmann::json::object();
  return s["syncer"]["progress"];
}

}  // namespace

TEST_CASE("off loop: work runs on workers and its tasks on the draining thread in order of finishing", "[unit]") {
  OffLoop off(4, 8);  // all four at once
  std::vector<int> order;
  const std::thread::id here = std::this_thread::get_id();
  std::atomic<int> on_workers{0};
  for (int i = 0; i < 4; i++) {
    REQUIRE(off.Run([&, i]() -> OffLoop::Task {
      if (std::this_thread::get_id() != here) on_workers++;
      std::this_thread::sleep_for(std::chrono::milliseconds(40 * (4 - i)));  // the last one finishes first
      return [&, i] {
        CHECK(std::this_thread::get_id() == here);
        order.push_back(i);
      };
    }));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (order.size() < 4 && Clock::now() < deadline) {
    off.Drain();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(on_workers == 4);
  REQUIRE(order.size() == 4);
  CHECK(order == std::vector<int>{3, 2, 1, 0});  // the shortest sleep first
  CHECK(off.in_flight() == 0);
}

TEST_CASE("off loop: a full queue refuses and work that throws has no task", "[unit]") {
  OffLoop off(1, 3);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  for (int i = 0; i < 3; i++) REQUIRE(off.Run([gate]() -> OffLoop::Task { gate.wait(); throw std::runtime_error("boom"); }));
  CHECK_FALSE(off.Run([]() -> OffLoop::Task { return nullptr; }));  // 3 in flight: refused
  CHECK(off.in_flight() == 3);
  release.set_value();
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (off.in_flight() > 0 && Clock::now() < deadline) {
    off.Drain();  // null tasks: nothing runs
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(off.in_flight() == 0);
  CHECK(off.Run([]() -> OffLoop::Task { return nullptr; }));
}

// site-b's daemon is stopped (SIGSTOP): it accepts connections and never answers. Requests that
// need it (logs, chaos on it) wait their deadline off site-a's loop; ping and status do not wait.
TEST_CASE("a hung peer delays only the requests that need it", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir, false, /*chaos=*/true);
  const std::string job = SubmitPaced(dir, *c);
  WaitStatus(*c, "site-a", job, [](const nlohmann::json& s) { return LearnerStep(s, 1) > 0; }, 30, "learner-1 to train");

  REQUIRE(::kill(c->pid("site-b"), SIGSTOP) == 0);
  const std::string a = c->SocketPath("site-a");
  auto logs = CallAsync(a, "logs", job, {{"tail", "5"}});
  auto chaos = CallAsync(a, "chaos", job, {{"action", "slow"}, {"site", "site-b"}, {"learner", "-1"}, {"value", "2"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int64_t slowest_ping = SlowestPingMs(a, 12);  // about 1.3 s, within the peer calls' 2-3 s deadlines
  nlohmann::json status;
  const auto t0 = Clock::now();
  REQUIRE(CallDaemonJson(a, "status", job, {}, &status, 5000).ok());
  const int64_t status_ms = MsSince(t0);
  Timed l = logs.get(), ch = chaos.get();
  REQUIRE(::kill(c->pid("site-b"), SIGCONT) == 0);

  INFO("slowest ping " << slowest_ping << " ms, status " << status_ms << " ms, logs " << l.ms << " ms, chaos " << ch.ms << " ms");
  // The peer calls were still waiting while the pings came back.
  CHECK(l.ms >= 1500);
  CHECK(slowest_ping < 500);
  CHECK(status_ms < 1000);
  // Each waiting request got its answer: site-a's lines, and what happened to site-b.
  REQUIRE(l.status.ok());
  CHECK_THAT(l.reply["text"], Catch::Contains("[site-a]") && Catch::Contains("site-b"));
  REQUIRE_FALSE(ch.status.ok());
  CHECK_THAT(ch.status.message(), Catch::Contains("site site-b"));
  REQUIRE(Ctl(dir, "stop " + job + " --socket '" + a + "'").exit_code == 0);
}

// A restarted syncer whose port is still taken keeps trying on its own thread: its daemon
// answers meanwhile, shows the syncer as starting, and the job goes on once the port is free.
TEST_CASE("a syncer that cannot bind yet leaves its daemon answering", "[e2e]") {
  testing::TempDir dir;
  auto c = StartCluster(dir);
  const std::string job = SubmitPaced(dir, *c);
  WaitStatus(*c, "site-s", job, [](const nlohmann::json& s) { return SyncerProgress(s).value("merges", 0) > 0; }, 40,
             "a first merge");
  REQUIRE(c->Stop("site-s").ok());

  // Take the syncer's uplink port before its daemon comes back.
  std::smatch m;
  const std::string site_config = ReadFile(c->ConfigPath("site-s"));
  REQUIRE(std::regex_search(site_config, m, std::regex("uplink: tcp://127\\.0\\.0\\.1:([0-9]+)")));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // not inherited by the daemon
  const int one = 1;  // the daemon's closed connections leave the port in TIME_WAIT
  REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(std::stoi(m[1]));
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 4) == 0);

  REQUIRE(c->Start("site-s").ok());
  const std::string s = c->SocketPath("site-s");
  nlohmann::json status;
  REQUIRE(CallDaemonJson(s, "status", job, {}, &status, 5000).ok());
  INFO(status.dump());
  CHECK(SyncerProgress(status).value("phase", "") == "starting");
  CHECK(SlowestPingMs(s, 10) < 500);  // while the syncer keeps trying to bind
  ::close(fd);
  WaitStatus(*c, "site-s", job, [](const nlohmann::json& s) { return SyncerProgress(s).value("running", false); }, 30,
             "the syncer to bind once the port is free");
  const long step = LearnerStep(status, 0);
  WaitStatus(*c, "site-s", job, [&](const nlohmann::json& s) { return LearnerStep(s, 0) > step + 20; }, 30,
             "learner-0 to go on training");
  REQUIRE(Ctl(dir, "stop " + job + " --socket '" + s + "'").exit_code == 0);
}

}  // namespace diloco
