// The job store (daemon/control/job_store.h): jobs survive in files, state changes are
// rewritten whole, ids are safe directory names.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "daemon/control/job_store.h"
#include "tests/temp_dir.h"

namespace diloco {

TEST_CASE("a job's record round-trips through the store", "[unit]") {
  testing::TempDir dir;
  JobStore store(dir.path().string());
  const std::string id = store.NewId();
  CHECK(IsJobId(id));
  CHECK_FALSE(store.Exists(id));
  JobRecord rec;
  rec.id = id;
  rec.submitted_to = "site-a";
  rec.created_ms = 123;
  rec.roles["learner-0"].state = JobState::kRunning;
  REQUIRE(store.Create(rec, "model: {}\n").ok());
  CHECK(store.Exists(id));
  CHECK(std::filesystem::is_directory(store.RunDir(id)));
  CHECK_FALSE(store.Create(rec, "x").ok());  // ids are never reused

  rec.state = JobState::kCompleted;
  rec.roles["learner-0"].state = JobState::kFailed;
  rec.roles["learner-0"].error = "boom";
  rec.roles["syncer"].state = JobState::kCompleted;
  rec.roles["syncer"].result = {{"merges", 7}};
  REQUIRE(store.Save(rec).ok());

  JobRecord back;
  REQUIRE(store.Load(id, &back).ok());
  CHECK(back.id == id);
  CHECK(back.state == JobState::kCompleted);
  CHECK(back.submitted_to == "site-a");
  CHECK(back.created_ms == 123);
  CHECK(back.updated_ms >= rec.created_ms);
  REQUIRE(back.roles.size() == 2);
  CHECK(back.roles["learner-0"].state == JobState::kFailed);
  CHECK(back.roles["learner-0"].error == "boom");
  CHECK(back.roles["syncer"].result["merges"] == 7);

  // A second store on the same directory (a restarted daemon) sees the same jobs.
  JobStore again(dir.path().string());
  CHECK(again.List() == std::vector<std::string>{id});
  store.AppendLog(id, "hello");
  std::ifstream log(store.LogPath(id));
  std::string line;
  std::getline(log, line);
  CHECK_THAT(line, Catch::EndsWith(" hello"));
}

TEST_CASE("job ids and states are checked", "[unit]") {
  CHECK(IsJobId("20260101-120000-ab12"));
  CHECK_FALSE(IsJobId(""));
  CHECK_FALSE(IsJobId("../etc"));
  CHECK_FALSE(IsJobId(".hidden"));
  CHECK_FALSE(IsJobId("a/b"));
  JobState s;
  for (JobState x : {JobState::kPending, JobState::kRunning, JobState::kCompleted, JobState::kFailed, JobState::kStopped}) {
    REQUIRE(ParseJobState(ToString(x), &s));
    CHECK(s == x);
  }
  CHECK_FALSE(ParseJobState("done", &s));
  CHECK(IsFinal(JobState::kStopped));
  CHECK_FALSE(IsFinal(JobState::kRunning));

  testing::TempDir dir;
  JobStore store(dir.path().string());
  JobRecord rec;
  CHECK_FALSE(store.Load("../x", &rec).ok());
  CHECK_THAT(store.Load("nosuch", &rec).message(), Catch::Contains("nosuch"));
  CHECK(store.Load("nosuch", &rec).code() == StatusCode::kNotFound);
  dir.Write("jobs/bad/state.json", "{not json");
  CHECK_THAT(store.Load("bad", &rec).message(), Catch::Contains("not JSON"));
  dir.Write("jobs/bad2/state.json", "{\"id\": \"bad2\", \"state\": \"weird\"}");
  CHECK_FALSE(store.Load("bad2", &rec).ok());
}

}  // namespace diloco
