// The rendezvous store of a ring across a site's hosts (daemon/control/ring_store.h): host 0's
// bounded table and the hex codec of the values the control channel carries.
#include <catch2/catch.hpp>

#include "daemon/control/ring_store.h"

namespace diloco {

TEST_CASE("ring store table: set, get, per job and ring, dropped with the job", "[unit]") {
  RingStoreTable t;
  std::string v;
  CHECK_FALSE(t.Get("j", "r", "k", &v));
  REQUIRE(t.Set("j", "r", "k", std::string("a\0b", 3)).ok());
  REQUIRE(t.Get("j", "r", "k", &v));
  CHECK(v == std::string("a\0b", 3));
  CHECK_FALSE(t.Get("j", "r2", "k", &v));   // another incarnation
  CHECK_FALSE(t.Get("j2", "r", "k", &v));   // another job
  REQUIRE(t.Set("j", "r", "k", "new").ok());  // replaced
  REQUIRE(t.Get("j", "r", "k", &v));
  CHECK(v == "new");
  t.DropJob("j");
  CHECK_FALSE(t.Get("j", "r", "k", &v));
}

TEST_CASE("ring store table: bounded names, values, keys and incarnations", "[unit]") {
  RingStoreLimits limits;
  limits.max_ring_bytes = 8;
  limits.max_value_bytes = 4;
  limits.max_keys_per_ring = 2;
  limits.max_rings_per_job = 2;
  RingStoreTable t(limits);
  CHECK_THAT(t.Set("j", "ring-name-too-long", "k", "v").message(), Catch::Contains("ring and key must be"));
  CHECK_THAT(t.Set("j", "r", "", "v").message(), Catch::Contains("ring and key must be"));
  CHECK_THAT(t.Set("j", "r", "k", "12345").message(), Catch::Contains("over the limit of 4"));
  REQUIRE(t.Set("j", "r", "a", "1").ok());
  REQUIRE(t.Set("j", "r", "b", "1").ok());
  CHECK_THAT(t.Set("j", "r", "c", "1").message(), Catch::Contains("already holds 2 keys"));
  REQUIRE(t.Set("j", "r", "a", "2").ok());  // replacing is not a new key
  // A third incarnation drops the oldest.
  REQUIRE(t.Set("j", "r2", "a", "1").ok());
  REQUIRE(t.Set("j", "r3", "a", "1").ok());
  CHECK(t.rings("j") == 2);
  std::string v;
  CHECK_FALSE(t.Get("j", "r", "a", &v));
  CHECK(t.Get("j", "r3", "a", &v));
}

TEST_CASE("ring store values travel as hex", "[unit]") {
  const std::vector<char> bytes = {0, 1, (char)0x7f, (char)0x80, (char)0xff, 'a'};
  const std::string hex = HexEncode(bytes);
  CHECK(hex == "00017f80ff61");
  std::vector<char> back;
  REQUIRE(HexDecode(hex, &back));
  CHECK(back == bytes);
  CHECK_FALSE(HexDecode("abc", &back));
  CHECK_FALSE(HexDecode("zz", &back));
  CHECK_FALSE(HexDecode("AB", &back));  // lower case only, as HexEncode writes
}

}  // namespace diloco
