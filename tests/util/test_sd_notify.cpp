#include "daemon/util/sd_notify.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "tests/temp_dir.h"

namespace diloco {
namespace {

using diloco::testing::TempDir;

// Sets NOTIFY_SOCKET for one test and unsets it afterwards.
class NotifyEnv {
 public:
  explicit NotifyEnv(const std::string& value) { setenv("NOTIFY_SOCKET", value.c_str(), 1); }
  ~NotifyEnv() { unsetenv("NOTIFY_SOCKET"); }
};

// A datagram socket standing in for systemd. name starting with '\0' binds
// in the abstract namespace.
class FakeSystemd {
 public:
  explicit FakeSystemd(const std::string& name) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(name.size() < sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, name.data(), name.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                                                 (name[0] == '\0' ? 0 : 1));
    REQUIRE(bind(fd_, reinterpret_cast<const sockaddr*>(&addr), len) == 0);
  }
  ~FakeSystemd() { close(fd_); }

  // The next datagram; a unix datagram is queued before sendto returns, so
  // no waiting is needed.
  std::string Receive() {
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    REQUIRE(n >= 0);
    return std::string(buf, static_cast<size_t>(n));
  }
  bool Empty() {
    char buf[16];
    return recv(fd_, buf, sizeof(buf), MSG_DONTWAIT) < 0;
  }

 private:
  int fd_ = -1;
};

TEST_CASE("SdNotify: sends the state as one datagram to a socket path", "[unit]") {
  TempDir dir;
  const std::string path = dir.file("notify");
  FakeSystemd systemd(path);
  NotifyEnv env(path);
  REQUIRE(SdNotify("READY=1\nSTATUS=2 jobs running").ok());
  REQUIRE(SdNotify("STOPPING=1").ok());
  CHECK(systemd.Receive() == "READY=1\nSTATUS=2 jobs running");
  CHECK(systemd.Receive() == "STOPPING=1");
  CHECK(systemd.Empty());
}

TEST_CASE("SdNotify: '@' names a socket in the abstract namespace", "[unit]") {
  const std::string name = "dilocod-test-notify-" + std::to_string(getpid());
  FakeSystemd systemd(std::string(1, '\0') + name);
  NotifyEnv env("@" + name);
  REQUIRE(SdNotify("READY=1").ok());
  CHECK(systemd.Receive() == "READY=1");
}

TEST_CASE("SdNotify: without NOTIFY_SOCKET it does nothing", "[unit]") {
  unsetenv("NOTIFY_SOCKET");
  CHECK(SdNotify("READY=1").ok());
}

TEST_CASE("SdNotify: a socket nobody listens on is an error that names it", "[unit]") {
  TempDir dir;
  NotifyEnv env(dir.file("nobody"));
  const Status st = SdNotify("READY=1");
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains(dir.file("nobody")));

  NotifyEnv relative("relative/path");
  CHECK_THAT(SdNotify("READY=1").message(), Catch::Contains("neither an absolute path"));
}

}  // namespace
}  // namespace diloco
