#include <catch2/catch.hpp>
#include <regex>

#include "daemon/util/log.h"

namespace diloco {
namespace {

TEST_CASE("every role's log line is '<UTC time ms>Z <who> <text>'", "[unit]") {
  using namespace std::chrono;
  const system_clock::time_point t = system_clock::time_point(seconds(1764968584)) + milliseconds(7);
  CHECK(LogStamp(t) == "2025-12-05T21:03:04.007Z");
  CHECK(LogLine(LogWho("dilocod", "site1"), "listening", t) == "2025-12-05T21:03:04.007Z dilocod[site1] listening");
  CHECK(LogLine(LogWho("learner-0", ""), "joined", t) == "2025-12-05T21:03:04.007Z learner-0 joined");
  CHECK(LogWho("syncer", "job-1") == "syncer[job-1]");
  CHECK(std::regex_match(LogLine("x", "y"), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z x y)")));
}

}  // namespace
}  // namespace diloco
