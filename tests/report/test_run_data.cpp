#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "daemon/report/html_report.h"
#include "daemon/report/job_report.h"
#include "daemon/report/run_data.h"
#include "tests/report/xml_check.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

using testing::TempDir;

bool HasNote(const RunData &run, const std::string &part) {
  for (const std::string &n : run.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// A two-learner decoupled run with a bad line 4 and a truncated last line.
void WriteDecoupledRun(const TempDir &dir) {
  dir.Write("config.yaml", "sync:\n  mode: decoupled\n  learners: 2\n");
  dir.Write("metrics.jsonl",
            "{\"event\":\"start\",\"learners\":2,\"mode\":\"decoupled\","
            "\"step\":0,\"val_loss\":5.5}\n"
            "{\"learner\":0,\"step\":10,\"loss\":4.0,\"tokens\":100,\"step_"
            "ms\":100,\"time_ms\":1000000,"
            "\"bytes_up\":10,\"bytes_down\":20}\n"
            "{\"learner\":1,\"step\":10,\"loss\":4.2,\"tokens\":100,\"step_"
            "ms\":50,\"time_ms\":1000100}\n"
            "{\"learner\":0,\"step\":20,\"loss\":3.\n"
            "{\"learner\":0,\"step\":20,\"loss\":3.5,\"tokens\":200,\"step_"
            "ms\":100,\"time_ms\":1002000}\n"
            "{\"event\":\"eval\",\"step\":40,\"val_loss\":3.4}\n"
            "{\"event\":\"summary\",\"final_val_loss\":3.4,\"goodput\":0.8,"
            "\"uptime\":1.0,\"tokens\":400,"
            "\"steps\":40,\"outer_steps\":3,\"bytes_up\":30,\"bytes_down\":60,"
            "\"wall_s\":2.5}\n"
            "{\"learner\":1,\"step\":");
  dir.Write("events.log.1",
            "{\"event\":\"merge\",\"time_ms\":1001000,\"fragment\":0,"
            "\"version\":1,\"reason\":\"all_live_in\","
            "\"contributors\":[{\"learner\":0,\"staleness\":0,\"tokens\":40},{\"learner\":1,"
            "\"staleness\":1,\"tokens\":40}]}\n");
  dir.Write("events.log",
            "{\"event\":\"merge\",\"time_ms\":1002000,\"fragment\":1,"
            "\"version\":2,\"reason\":\"grace_expired\","
            "\"contributors\":[{\"learner\":1,\"staleness\":2,\"tokens\":40}]}\n");
}

}  // namespace

TEST_CASE("LoadRunDir reads a run directory and notes its damaged lines", "[unit]") {
  TempDir dir;
  WriteDecoupledRun(dir);
  RunData run;
  REQUIRE(LoadRunDir(dir.path().string(), "", &run).ok());
  INFO(run.notes.size());
  CHECK(run.label == dir.path().filename().string());
  CHECK(run.mode == "decoupled");
  CHECK(run.learners == 2);
  REQUIRE(run.traces.size() == 2);
  CHECK(run.traces[0].learner == 0);
  REQUIRE(run.traces[0].points.size() == 2);
  CHECK(run.traces[0].points[1].loss == 3.5);
  CHECK(run.traces[0].points[0].bytes_down == 20);
  CHECK(std::isnan(run.traces[1].points[0].bytes_up));
  CHECK(run.initial_val_loss == 5.5);
  REQUIRE(run.evals.size() == 1);
  CHECK(run.evals[0].val_loss == 3.4);
  CHECK(run.summary.present);
  CHECK(run.summary.goodput == 0.8);
  CHECK(run.TokensPerStep() == 10);
  CHECK(HasNote(run, "metrics.jsonl line 4: not a JSON object"));
  CHECK(HasNote(run, "metrics.jsonl line 8: truncated last line"));

  // The rotated part of the tape comes first.
  REQUIRE(run.merges.size() == 2);
  CHECK(run.merges[0].version == 1);
  CHECK(run.merges[0].staleness == std::vector<long>{0, 1});
  CHECK(run.merges[1].reason == "grace_expired");

  // Wall time from time_ms: the start is the first line less its 10 steps of
  // 100 ms.
  CHECK(run.wall_from_timestamps);
  CHECK(run.traces[0].points[0].wall_s == Approx(1.0));
  CHECK(run.traces[0].points[1].wall_s == Approx(3.0));
  CHECK(run.merges[0].wall_s == Approx(2.0));
}

TEST_CASE("Without time_ms the wall time is the summed step_ms", "[unit]") {
  TempDir dir;
  dir.Write("metrics.jsonl",
            "{\"step\":10,\"loss\":4.0,\"tokens\":100,\"step_ms\":100}\n"
            "{\"step\":20,\"loss\":3.0,\"tokens\":200,\"step_ms\":200}\n");
  RunData run;
  REQUIRE(LoadRunDir(dir.path().string(), "single", &run).ok());
  CHECK(run.label == "single");
  CHECK_FALSE(run.wall_from_timestamps);
  REQUIRE(run.traces.size() == 1);
  CHECK(run.traces[0].points[0].wall_s == Approx(1.0));
  CHECK(run.traces[0].points[1].wall_s == Approx(3.0));
  CHECK(run.learners == 1);
  CHECK(HasNote(run, "config.yaml: missing"));
  CHECK(HasNote(run, "no summary line"));
  CHECK(HasNote(run, "no time_ms"));
}

TEST_CASE("A daemon job's run directory has one metrics file per learner", "[unit]") {
  TempDir dir;
  dir.Write("learner-0.jsonl",
            "{\"learner\":0,\"step\":10,\"loss\":4.0,"
            "\"tokens\":100,\"step_ms\":10}\n");
  dir.Write("learner-1.jsonl", "{\"step\":10,\"loss\":4.5,\"tokens\":100,\"step_ms\":10}\n");
  dir.Write("learner-1.step", "10");
  RunData run;
  REQUIRE(LoadRunDir(dir.path().string(), "", &run).ok());
  REQUIRE(run.traces.size() == 2);
  CHECK(run.traces[1].learner == 1);  // from the file name when the line does not say
  CHECK(run.traces[1].points[0].loss == 4.5);
  CHECK_FALSE(run.has_events_log);
}

// A job of two syncer shards: each shard's site keeps its own merge tape; the job's report reads
// them all (JobRunDirs) and plots one tape, in time order.
TEST_CASE("A sharded job's report joins every shard's merge tape in time order", "[unit]") {
  TempDir home, other;
  home.Write("events.log",
             "{\"event\":\"merge\",\"time_ms\":1000,\"fragment\":0,\"version\":1,\"contributors\":[]}\n"
             "{\"event\":\"merge\",\"time_ms\":3000,\"fragment\":0,\"version\":2,\"contributors\":[]}\n");
  other.Write("events.log",
              "{\"event\":\"merge\",\"time_ms\":2000,\"fragment\":1,\"version\":1,\"contributors\":[]}\n");
  const nlohmann::json status = {
      {"id", "j"},
      {"syncer_site", "s"},
      {"shards", {{{"shard", 0}, {"site", "s"}}, {{"shard", 1}, {"site", "t"}}}},
      {"learners", {{{"site", "a"}}}},
      {"sites",
       {{"s", {{"run_dir", home.path().string()}}},
        {"t", {{"run_dir", other.path().string()}}},
        {"a", {{"run_dir", "/nonexistent/run"}}}}}};
  std::vector<std::string> unreachable;
  const std::vector<std::string> dirs = JobRunDirs(status, &unreachable);
  CHECK(dirs == std::vector<std::string>{home.path().string(), other.path().string()});
  CHECK(unreachable == std::vector<std::string>{"a: /nonexistent/run"});
  RunData run;
  REQUIRE(LoadJobRun(status, "", &run).ok());
  REQUIRE(run.merges.size() == 3);
  CHECK(run.merges[0].time_ms == 1000);
  CHECK(run.merges[1].fragment == 1);
  CHECK(run.merges[2].time_ms == 3000);
}

TEST_CASE("LoadRunDir fails only on a missing directory", "[unit]") {
  RunData run;
  const Status st = LoadRunDir("/nonexistent/run/dir", "", &run);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("/nonexistent/run/dir") != std::string::npos);

  TempDir empty;
  REQUIRE(LoadRunDir(empty.path().string(), "", &run).ok());
  CHECK(run.traces.empty());
  CHECK(HasNote(run, "metrics.jsonl (or learner-<i>.jsonl): missing"));

  // Garbage of every kind: wrong types, arrays, huge numbers, binary.
  TempDir odd;
  odd.Write("config.yaml", "sync: [unclosed\n");
  const char kOddLines[] =
      "[1,2]\n\"str\"\n{\"step\":\"x\",\"loss\":null}\n"
      "{\"event\":\"eval\",\"step\":1e300,\"val_loss\":\"bad\"}\n"
      "{\"event\":\"summary\",\"goodput\":\"high\"}\n\x00\xff\n";
  odd.Write("metrics.jsonl", std::string(kOddLines, sizeof kOddLines - 1));
  odd.Write("events.log", "{\"event\":\"merge\",\"contributors\":[1,{\"staleness\":-3}]}\n");
  REQUIRE(LoadRunDir(odd.path().string(), "", &run).ok());
  CHECK(HasNote(run, "config.yaml: cannot be parsed"));
  CHECK(HasNote(run, "metrics.jsonl line 1"));
  CHECK(HasNote(run, "events.log: a merge record without a field it needs"));
  CHECK(run.merges.empty());
  CHECK(std::isnan(run.summary.goodput));
  const std::string page = RenderHtmlReport({run});
  CHECK(testing::XmlProblem(page, true) == "");
}

TEST_CASE("The page escapes labels, shows notes and has every panel", "[unit]") {
  TempDir dir;
  WriteDecoupledRun(dir);
  RunData run;
  REQUIRE(LoadRunDir(dir.path().string(), "<b>run & co</b>", &run).ok());
  const std::string page = RenderHtmlReport({run});
  CHECK(testing::XmlProblem(page, true) == "");
  CHECK(page.find("<b>run") == std::string::npos);
  CHECK(page.find("&lt;b&gt;run &amp; co&lt;/b&gt;") != std::string::npos);
  CHECK(page.find("metrics.jsonl line 4") != std::string::npos);
  CHECK(page.find("<script") == std::string::npos);
  for (const std::string &id : ReportPanelIds()) CHECK(page.find("id=\"" + id + "\"") != std::string::npos);
  for (const std::string &svg : testing::SvgElements(page)) CHECK(testing::XmlProblem(svg) == "");
}

}  // namespace diloco
