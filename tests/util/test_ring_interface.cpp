// PinNcclToRingInterface (daemon/util/ring_interface.h) against this host's real interfaces.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "daemon/util/ring_interface.h"

namespace diloco {

TEST_CASE("a ring address maps to the interface that holds it, or names what is wrong", "[unit]") {
  std::string name;
  REQUIRE(InterfaceOfAddress("127.0.0.1", &name).ok());
  CHECK(name == "lo");
  // Not held by lo, but on its network (127.0.0.1/8).
  REQUIRE(InterfaceOfAddress("127.0.0.2", &name).ok());
  CHECK(name == "lo");
  // TEST-NET-3: no interface of a test machine is on it.
  CHECK_THAT(InterfaceOfAddress("203.0.113.7", &name).message(),
             Catch::Contains("no network interface of this host holds ring_address '203.0.113.7'"));
  CHECK_THAT(InterfaceOfAddress("no-such-host.invalid", &name).message(),
             Catch::Contains("ring_address 'no-such-host.invalid' does not resolve"));
}

TEST_CASE("NCCL is pinned to the ring interface unless the operator chose one", "[unit]") {
  unsetenv("NCCL_SOCKET_IFNAME");
  std::string said;
  REQUIRE(PinNcclToRingInterface("127.0.0.1", &said).ok());
  REQUIRE(std::getenv("NCCL_SOCKET_IFNAME") != nullptr);
  CHECK(std::string(std::getenv("NCCL_SOCKET_IFNAME")) == "=lo");
  CHECK_THAT(said, Catch::Contains("the interface of ring_address 127.0.0.1"));

  setenv("NCCL_SOCKET_IFNAME", "ib0", 1);
  REQUIRE(PinNcclToRingInterface("127.0.0.1", &said).ok());
  CHECK(std::string(std::getenv("NCCL_SOCKET_IFNAME")) == "ib0");
  CHECK_THAT(said, Catch::Contains("set by the environment"));

  unsetenv("NCCL_SOCKET_IFNAME");
  CHECK_FALSE(PinNcclToRingInterface("203.0.113.7", &said).ok());
  CHECK(std::getenv("NCCL_SOCKET_IFNAME") == nullptr);
}

}  // namespace diloco
