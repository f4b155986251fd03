// The local control socket (local_socket.h) on real AF_UNIX sockets: requests and replies, and
// clients that break its rules: an oversized announcement, a never-ending request, garbage, too
// many connections, half-sent requests; the server's held bytes stay within its caps and other
// clients keep getting answers.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "daemon/net/local_socket.h"
#include "tests/net/transport_test_util.h"
#include "tests/temp_dir.h"

namespace diloco::net {
namespace {

using testing::LogCapture;
using testing::TestMessage;
using testing::TestValidator;
using testing::WaitFor;

void PutU32(uint32_t v, std::vector<uint8_t>* out) {
  for (int i = 0; i < 4; i++) out->push_back((uint8_t)(v >> (8 * i)));
}

// The prefix of a message of one frame of `frame_bytes`.
std::vector<uint8_t> OneFramePrefix(uint64_t frame_bytes) {
  std::vector<uint8_t> p(std::begin(kStreamMagic), std::end(kStreamMagic));
  PutU32(1, &p);
  PutU32((uint32_t)frame_bytes, &p);
  return p;
}
constexpr uint64_t kOneFramePrefixBytes = kStreamFixedPrefixBytes + 4;

// A server on its own thread that echoes every valid request (as its owner loop would); its
// stats are copied out after every turn.
class EchoServer {
 public:
  explicit EchoServer(const std::string& path, LocalServerOptions options = {}) {
    if (!options.validator) options.validator = TestValidator;
    REQUIRE(LocalServer::Create(path, std::move(options), &server_).ok());
    thread_ = std::thread([this] { Loop(); });
  }
  ~EchoServer() {
    stop_ = true;
    thread_.join();
  }
  LocalServerStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  void Loop() {
    std::vector<PollFd> fds;
    std::vector<bool> ready;
    while (!stop_) {
      fds.clear();
      server_->AddPollFds(&fds);
      (void)PollReadable({}, fds, 10, &ready);
      server_->Service(fds);
      LocalReceived r;
      while (server_->Receive(&r)) (void)server_->SendTo(r.connection, r.message);
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = server_->stats();
    }
  }

  std::unique_ptr<LocalServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  LocalServerStats stats_;
};

// True once the server has closed c's connection (a read sees the end), within timeout_ms.
bool ClosedByServer(LocalClient& c, int timeout_ms = 5000) {
  Message m;
  const Status st = c.Receive(&m, timeout_ms);
  return !st.ok() && st.message().find("closed the connection") != std::string::npos;
}

Status Echo(const std::string& path, const std::string& payload, int timeout_ms = 5000) {
  Message reply;
  DL_RETURN_IF_ERROR(LocalCall(path, TestMessage("ctl", 1, 1, payload), timeout_ms, &reply));
  if (reply.size() != 2 || reply.frame_view(1) != payload) return Status::Error("a wrong echo");
  return Status::Ok();
}

TEST_CASE("local socket: requests and their replies, one per connection or several on one", "[net]") {
  diloco::testing::TempDir dir;
  const std::string path = dir.file("ctl.sock");
  EchoServer server(path);
  REQUIRE(Echo(path, "hello").ok());
  REQUIRE(Echo(path, std::string(1 << 20, 'z')).ok());  // a big request, read over several turns

  std::unique_ptr<LocalClient> c;
  REQUIRE(LocalClient::Connect(path, 1000, &c).ok());
  for (int i = 0; i < 5; i++) {
    REQUIRE(c->Send(TestMessage("ctl", 1, (uint64_t)i + 1, std::to_string(i * 7)), 1000).ok());
  }
  for (int i = 0; i < 5; i++) {
    Message m;
    REQUIRE(c->Receive(&m, 5000).ok());
    REQUIRE(m.size() == 2);
    CHECK(m.frame_view(1) == std::to_string(i * 7));
  }
  c.reset();
  REQUIRE(WaitFor([&] { return server.stats().connections == 0; }));
  const LocalServerStats s = server.stats();
  CHECK(s.received == 7);
  CHECK(s.sent == 7);
  CHECK(s.buffered_bytes == 0);
  CHECK(s.closed_over_cap + s.closed_bad_format + s.closed_rejected + s.closed_timeout == 0);
}

TEST_CASE("local socket: a header announcing cap + 1 bytes is disconnected, naming the peer", "[net]") {
  diloco::testing::TempDir dir;
  const std::string path = dir.file("ctl.sock");
  LogCapture log;
  LocalServerOptions o;
  o.limits.max_message_bytes = 64 << 10;
  EchoServer server(path, o);
  std::unique_ptr<LocalClient> c;
  REQUIRE(LocalClient::Connect(path, 1000, &c).ok());
  REQUIRE(c->WriteAll(OneFramePrefix(o.limits.max_message_bytes - kOneFramePrefixBytes + 1), 1000).ok());
  CHECK(ClosedByServer(*c));
  REQUIRE(WaitFor([&] { return server.stats().closed_over_cap == 1; }));
  CHECK(server.stats().peak_buffered_bytes <= kOneFramePrefixBytes);
  CHECK(log.Contains("pid " + std::to_string(getpid()) + " uid " + std::to_string(getuid())));
  CHECK(log.Contains("over the cap"));
  // Exactly the cap is a request like any other.
  REQUIRE(Echo(path, std::string(o.limits.max_message_bytes - kStreamFixedPrefixBytes - 8 - 9, 'c')).ok());
}

TEST_CASE("local socket: a request that never ends costs at most the cap, and others get answers meanwhile", "[net]") {
  diloco::testing::TempDir dir;
  const std::string path = dir.file("ctl.sock");
  LogCapture log;
  LocalServerOptions o;  // the daemon's cap: 2 MiB
  o.max_connections = 4;
  const uint64_t cap = o.limits.max_message_bytes;
  EchoServer server(path, o);

  // What a ZeroMQ attacker did (128 frames of 1 MiB, never a last one) as a raw stream: a message
  // announcing the cap, then 128 MiB more without a stop.
  std::atomic<uint64_t> written{0};
  std::atomic<bool> cut_off{false};
  std::thread attacker([&] {
    std::unique_ptr<LocalClient> c;  // no Catch assertions on this thread
    if (!LocalClient::Connect(path, 1000, &c).ok() || !c->WriteAll(OneFramePrefix(cap - kOneFramePrefixBytes), 1000).ok())
      return;
    const std::vector<uint8_t> mib(1 << 20, 0xab);
    for (int i = 0; i < 128; i++) {
      if (!c->WriteAll(mib, 5000).ok()) {
        cut_off = true;
        return;
      }
      written += mib.size();
    }
  });
  // Meanwhile a well-behaved client is answered.
  for (int i = 0; i < 20; i++) REQUIRE(Echo(path, "ping " + std::to_string(i)).ok());
  attacker.join();
  CHECK(cut_off);
  INFO("the attacker wrote " << written << " bytes before it was cut off");
  // Past the cap only what the kernel's socket buffers took.
  CHECK(written <= cap + (uint64_t{4} << 20));
  // Its cap's worth failed the checks.
  REQUIRE(WaitFor([&] { return server.stats().closed_rejected + server.stats().closed_bad_format == 1; }));
  const LocalServerStats s = server.stats();
  CHECK(s.peak_buffered_bytes <= cap * o.max_connections);
  CHECK(s.peak_buffered_bytes <= cap + 4096);  // the others' requests are tiny
  CHECK(log.Contains("pid " + std::to_string(getpid())));
}

TEST_CASE("local socket: many clients holding unfinished requests never make it hold more than cap x connections",
          "[net]") {
  diloco::testing::TempDir dir;
  const std::string path = dir.file("ctl.sock");
  LogCapture log;
  LocalServerOptions o;
  o.max_connections = 4;
  o.limits.max_message_bytes = 256 << 10;
  const uint64_t cap = o.limits.max_message_bytes;
  EchoServer server(path, o);
  // 12 clients, each sends all of a request at the cap but its last byte.
  std::vector<std::unique_ptr<LocalClient>> held(12);
  std::vector<uint8_t> almost = OneFramePrefix(cap - kOneFramePrefixBytes);
  almost.resize(cap - 1, 'h');
  for (auto& c : held) {
    REQUIRE(LocalClient::Connect(path, 1000, &c).ok());
    REQUIRE(c->WriteAll(almost, 5000).ok());
  }
  REQUIRE(WaitFor([&] { return server.stats().closed_evicted >= held.size() - o.max_connections; }));
  REQUIRE(WaitFor([&] { return server.stats().buffered_bytes == o.max_connections * (cap - 1); }));
  // A new client still gets its answer (an unfinished one makes room), again and again.
  for (int i = 0; i < 10; i++) REQUIRE(Echo(path, "still here").ok());
  const LocalServerStats s = server.stats();
  CHECK(s.connections <= o.max_connections);
  CHECK(s.peak_buffered_bytes <= cap * o.max_connections);
  CHECK(log.Contains("to make room"));
  // The oldest were closed: their reads end.
  CHECK(ClosedByServer(*held[0], 1000));
}

TEST_CASE("local socket: garbage, a ZMTP greeting and invalid requests close the connection", "[net]") {
  diloco::testing::TempDir dir;
  const std::string path = dir.file("ctl.sock");
  LogCapture log;
  EchoServer server(path);
  {
    std::unique_ptr<LocalClient> c;
    REQUIRE(LocalClient::Connect(path, 1000, &c).ok());
    const std::vector<uint8_t> zmtp = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    REQUIRE(c->WriteAll(zmtp, 1000).ok());
    CHECK(ClosedByServer(*c));
  }
  {
    std::unique_ptr<LocalClient> c;
    REQUIRE(LocalClient::Connect(path, 1000, &c).ok());
    Message bad;
    bad.AddCopy(std::string("not a test header"));
    REQUIRE(c->Send(bad, 1000).ok());
    CHECK(ClosedByServer(*c));
  }
  REQUIRE(WaitFor([&] { return server.stats().closed_bad_format == 1 && server.stats().closed_rejected == 1; }));
  CHECK(log.Contains("failed its checks"));
  CHECK(server.stats().received == 0);
  REQUIRE(Echo(path, "fine").ok());
}

TEST_CASE("local socket: a half-sent request and an idle connection time out", "[net]") {
  diloco::testing::TempDir dir;
  const std::string path = dir.file("ctl.sock");
  LogCapture log;
  // One thread and a fake clock: the server turns only when the test says.
  SteadyTime now = std::chrono::steady_clock::now();
  LocalServerOptions o;
  o.validator = TestValidator;
  o.message_timeout_ms = 5000;
  o.idle_timeout_ms = 60000;
  o.clock = [&now] { return now; };
  std::unique_ptr<LocalServer> server;
  REQUIRE(LocalServer::Create(path, o, &server).ok());
  auto turn = [&] {
    std::vector<PollFd> fds;
    std::vector<bool> ready;
    server->AddPollFds(&fds);
    (void)PollReadable({}, fds, 20, &ready);
    server->Service(fds);
  };
  std::unique_ptr<LocalClient> half, idle;
  REQUIRE(LocalClient::Connect(path, 1000, &half).ok());
  REQUIRE(LocalClient::Connect(path, 1000, &idle).ok());
  REQUIRE(half->WriteAll(OneFramePrefix(1000), 1000).ok());
  for (int i = 0; i < 50 && server->stats().buffered_bytes == 0; i++) turn();
  REQUIRE(server->stats().connections == 2);
  REQUIRE(server->stats().buffered_bytes == kOneFramePrefixBytes);

  now += std::chrono::milliseconds(4999);
  turn();
  CHECK(server->stats().closed_timeout == 0);
  now += std::chrono::milliseconds(1);
  turn();
  CHECK(server->stats().closed_timeout == 1);
  CHECK(server->stats().buffered_bytes == 0);
  CHECK(server->stats().connections == 1);
  CHECK(ClosedByServer(*half, 1000));
  CHECK(log.Contains("did not finish it within 5000 ms"));

  now += std::chrono::milliseconds(60000);
  turn();
  CHECK(server->stats().closed_timeout == 2);
  CHECK(server->stats().connections == 0);
  CHECK(ClosedByServer(*idle, 1000));
}

TEST_CASE("local socket: a client that never reads its replies is closed at the backlog cap", "[net]") {
  diloco::testing::TempDir dir;
  const std::string path = dir.file("ctl.sock");
  LocalServerOptions o;
  o.max_reply_backlog_bytes = 1 << 20;
  EchoServer server(path, o);
  std::unique_ptr<LocalClient> c;
  REQUIRE(LocalClient::Connect(path, 1000, &c).ok());
  const std::string payload(256 << 10, 'r');
  Status st;
  for (int i = 0; i < 200 && st.ok(); i++) st = c->Send(TestMessage("ctl", 1, (uint64_t)i + 1, payload), 2000);
  CHECK_FALSE(st.ok());
  REQUIRE(WaitFor([&] { return server.stats().closed_backlog == 1; }));
  CHECK(server.stats().reply_backlog_bytes == 0);
  REQUIRE(Echo(path, "others fine").ok());
}

TEST_CASE("local socket: the socket file goes with the server, a stale one is refused", "[net]") {
  diloco::testing::TempDir dir;
  const std::string path = dir.file("ctl.sock");
  LocalServerOptions o;
  o.validator = TestValidator;
  {
    std::unique_ptr<LocalServer> s;
    REQUIRE(LocalServer::Create(path, o, &s).ok());
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
    std::unique_ptr<LocalServer> again;
    CHECK(LocalServer::Create(path, o, &again).code() == StatusCode::kAddressInUse);
  }
  CHECK_FALSE(std::filesystem::exists(path));
  Message reply;
  CHECK_FALSE(LocalCall(path, TestMessage("ctl", 1, 1), 500, &reply).ok());
}

}  // namespace
}  // namespace diloco::net
