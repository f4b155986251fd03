#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/sync/event_log.h"
#include "daemon/sync/goodput.h"
#include "daemon/util/appended_lines.h"
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

TEST_CASE("sync: the event log rotates and a reader that follows it sees every merge once", "[unit][sync]") {
  TempDir dir;
  const std::string path = dir.file("events.log");
  const int64_t line_bytes = (int64_t)MergeEventToJson(SomeMerge()).dump().size() + 1;
  EventLog log;
  REQUIRE(log.Open(path, 10 * line_bytes).ok());  // about 10 merges a part
  AppendedLines reader(path);
  std::vector<uint64_t> seen;
  const auto read = [&] {
    reader.ReadNew([&](std::string_view line, int64_t) {
      seen.push_back(nlohmann::json::parse(line)["version"].get<uint64_t>());
      return true;
    });
  };
  for (uint64_t v = 1; v <= 25; v++) {
    MergeEvent e = SomeMerge();
    e.version = v;
    REQUIRE(log.Append(e).ok());
    if (v % 4 == 0) read();  // the reader lags: rotations happen between its reads
  }
  read();
  REQUIRE(seen.size() == 25);
  for (uint64_t v = 1; v <= 25; v++) CHECK(seen[v - 1] == v);
  // On disk: the last part and the one before it, no more.
  CHECK(std::filesystem::file_size(path) <= (uint64_t)(10 * line_bytes));
  CHECK(std::filesystem::exists(path + ".1"));
  CHECK_FALSE(std::filesystem::exists(path + ".2"));
  // The whole-tape reader reads both parts, the rotated one first.
  std::vector<MergedDelta> merged;
  REQUIRE(ReadMergedDeltas(path, 0, &merged).ok());
  REQUIRE(!merged.empty());
  CHECK(merged.size() % 2 == 0);  // two contributors a merge
  const size_t merges_on_disk = merged.size() / 2;
  CHECK(merges_on_disk >= 11);
  CHECK(merges_on_disk <= 21);
}

}  // namespace
}  // namespace diloco
