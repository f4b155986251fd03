#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/sync/event_log.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

using diloco::testing::TempDir;

MergeEvent SomeMerge() {
  MergeEvent e;
  e.time_ms = 1767225600123;
  e.fragment = 2;
  e.version = 17;
  e.reason = "grace_expired";
  e.grace_ms = 412.5;
  e.delta_norm = 0.25;
  e.update_norm = 0.5;
  e.contributors = {{0, 0.75, 0, 16, 9216, 12}, {1, 0.25, 2, 14, 3072, 12}};
  e.skipped = {{3, "too_stale", "base 11, current 16"}};
  return e;
}

TEST_CASE("sync: a merge event is one JSON object with contributors and skipped deltas",
          "[unit][sync]") {
  const nlohmann::json j = MergeEventToJson(SomeMerge());
  CHECK(j["event"] == "merge");
  CHECK(j["time_ms"] == 1767225600123);
  CHECK(j["fragment"] == 2);
  CHECK(j["version"] == 17);
  CHECK(j["reason"] == "grace_expired");
  CHECK(j["grace_ms"] == 412.5);
  CHECK(j["delta_norm"] == 0.25);
  CHECK(j["update_norm"] == 0.5);
  REQUIRE(j["contributors"].size() == 2);
  CHECK(j["contributors"][1] == nlohmann::json{{"learner", 1},
                                               {"weight", 0.25},
                                               {"staleness", 2},
                                               {"base_version", 14},
                                               {"tokens", 3072.0},
                                               {"steps", 12.0}});
  CHECK(j["skipped"][0] ==
        nlohmann::json{{"learner", 3}, {"why", "too_stale"}, {"detail", "base 11, current 16"}, {"tokens", 0.0}});
  CHECK(MergeEventToJson(MergeEvent{})["contributors"].is_array());
}

TEST_CASE("sync: the event log appends one line per merge", "[unit][sync]") {
  TempDir dir;
  const std::string path = dir.file("events.log");
  {
    EventLog log;
    REQUIRE(log.Open(path).ok());
    REQUIRE(log.Append(SomeMerge()).ok());
  }
  {
    EventLog log;  // a restarted syncer appends
    REQUIRE(log.Open(path).ok());
    MergeEvent e = SomeMerge();
    e.version = 18;
    REQUIRE(log.Append(e).ok());
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 2);
  CHECK(lines[0]["version"] == 17);
  CHECK(lines[1]["version"] == 18);
  CHECK(lines[1]["contributors"][0]["weight"] == 0.75);

  EventLog bad;
  CHECK_FALSE(bad.Open(dir.file("missing/dir/events.log")).ok());
}

}  // namespace
}  // namespace diloco
