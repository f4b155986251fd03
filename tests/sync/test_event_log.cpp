#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/sync/event_log.h"
#include "daemon/sync/goodput.h"
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
  e.contributors = {{0, 0.75, 0, 16, 9216, 12, 60}, {1, 0.25, 2, 14, 3072, 12, 48}};
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
                                               {"steps", 12.0},
                                               {"learner_step", 48}});
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

TEST_CASE("sync: the event log rotates and the reader reads both parts in order", "[unit][sync]") {
  TempDir dir;
  const std::string path = dir.file("events.log");
  const int64_t line_bytes = (int64_t)MergeEventToJson(SomeMerge()).dump().size() + 1;
  EventLog log;
  REQUIRE(log.Open(path, 10 * line_bytes).ok());  // about 10 merges a part
  for (uint64_t v = 1; v <= 25; v++) {
    MergeEvent e = SomeMerge();
    e.version = v;
    REQUIRE(log.Append(e).ok());
  }
  // On disk: the last part and the one before it, no more.
  CHECK(std::filesystem::file_size(path) <= (uint64_t)(10 * line_bytes));
  CHECK(std::filesystem::exists(path + ".1"));
  CHECK_FALSE(std::filesystem::exists(path + ".2"));
  // The rotated part first: the versions on disk, in order, up to the last.
  std::vector<MergeEvent> events;
  REQUIRE(ReadEventLog(path, false, &events).ok());
  REQUIRE(events.size() >= 11);
  REQUIRE(events.size() <= 21);
  for (size_t k = 0; k < events.size(); k++) CHECK(events[k].version == 25 - events.size() + 1 + k);
  std::vector<MergedDelta> merged;
  REQUIRE(ReadMergedDeltas(path, 0, &merged).ok());
  CHECK(merged.size() == 2 * events.size());  // two contributors a merge
}

TEST_CASE("sync: a merge line reads back as the event that was written", "[unit][sync]") {
  const MergeEvent e = SomeMerge();
  MergeEvent back;
  REQUIRE(MergeEventFromJson(nlohmann::json::parse(MergeEventToJson(e).dump()), "here", &back).ok());
  CHECK(MergeEventToJson(back) == MergeEventToJson(e));
  nlohmann::json no_tokens = MergeEventToJson(e);
  no_tokens["contributors"][0].erase("tokens");
  const Status st = MergeEventFromJson(no_tokens, "events.log line 3", &back);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("events.log line 3"));
  CHECK_FALSE(MergeEventFromJson(nlohmann::json::parse(R"({"event":"merge","fragment":"x"})"), "l", &back).ok());
}

TEST_CASE("sync: a damaged events.log line is an error that names it and a torn last line is not", "[unit][sync]") {
  TempDir dir;
  const std::string path = dir.file("events.log");
  const std::string line = MergeEventToJson(SomeMerge()).dump();
  std::ofstream(path) << line << "\nnot json\n" << line << "\n";
  std::vector<MergeEvent> events;
  const Status st = ReadEventLog(path, false, &events);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("events.log line 2"));
  std::ofstream(path) << line << "\n" << line.substr(0, 20);  // the syncer is writing the last one
  events.clear();
  REQUIRE(ReadEventLog(path, false, &events).ok());
  CHECK(events.size() == 1);
  events.clear();
  CHECK(ReadEventLog(dir.file("none.log"), true, &events).ok());
  CHECK(events.empty());
  CHECK_FALSE(ReadEventLog(dir.file("none.log"), false, &events).ok());
}

}  // namespace
}  // namespace diloco
