#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "daemon/config/chaos_config.h"
#include "daemon/config/run_config.h"
#include "tests/config/config_testing.h"

namespace diloco {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using diloco::testing::ErrorOf;
using diloco::testing::Parse;

// Every action kind once; chaos comes before sync so that learner indices are checked against
// sync.learners whatever the order of the sections.
const char* kAllActions = R"(data: {corpus: c.txt}
chaos:
  seed: 42
  events:
    - {at_s: 30, kill: {learner: 1, restart_after_s: 10}}
    - {at_step: 200, slow: {learner: 2, factor: 3, duration_s: 20}}
    - {at_s: 50, partition: {learner: 3, duration_s: 10}}
    - {at_s: 60, drop: {prob: 0.05, duration_s: 30}}
    - {at_s: 60, corrupt: {prob: 0.01, duration_s: 10, learner: 0}}
    - {at_s: 80, syncer_kill: {restart_after_s: 5}}
    - {at_step: 7, kill: {learner: 0}}
    - {at_s: 90, syncer_kill: {}}
  random: {mtbf_s: 600, mttr_s: 12, from_s: 5, until_s: 500}
sync: {learners: 4, quorum: 2}
)";

ChaosEvent Event(double at_s, int at_step, ChaosEventKind kind, int learner) {
  ChaosEvent e;
  e.at_s = at_s;
  e.at_step = at_step;
  e.kind = kind;
  e.learner = learner;
  return e;
}

TEST_CASE("chaos: every action kind is read", "[unit][chaos]") {
  RunConfig config;
  Status status = Parse(kAllActions, {}, &config);
  REQUIRE(status.message() == "");
  const ChaosConfig& c = config.chaos;
  CHECK(c.seed == 42);
  REQUIRE(c.events.size() == 8);

  ChaosEvent kill = Event(30, -1, ChaosEventKind::kKill, 1);
  kill.restart_after_s = 10;
  CHECK(c.events[0] == kill);
  ChaosEvent slow = Event(0, 200, ChaosEventKind::kSlow, 2);
  slow.factor = 3;
  slow.duration_s = 20;
  CHECK(c.events[1] == slow);
  ChaosEvent partition = Event(50, -1, ChaosEventKind::kPartition, 3);
  partition.duration_s = 10;
  CHECK(c.events[2] == partition);
  ChaosEvent drop = Event(60, -1, ChaosEventKind::kDrop, -1);  // no learner: all links
  drop.prob = 0.05;
  drop.duration_s = 30;
  CHECK(c.events[3] == drop);
  ChaosEvent corrupt = Event(60, -1, ChaosEventKind::kCorrupt, 0);
  corrupt.prob = 0.01;
  corrupt.duration_s = 10;
  CHECK(c.events[4] == corrupt);
  ChaosEvent syncer = Event(80, -1, ChaosEventKind::kSyncerKill, -1);
  syncer.restart_after_s = 5;
  CHECK(c.events[5] == syncer);
  CHECK(c.events[6] == Event(0, 7, ChaosEventKind::kKill, 0));  // never restarted
  CHECK(c.events[7] == Event(90, -1, ChaosEventKind::kSyncerKill, -1));
  CHECK(c.random == RandomFailureConfig{600, 12, 5, 500});

  // No chaos section: nothing injected.
  REQUIRE(Parse(testing::kMinimal, {}, &config).ok());
  CHECK(config.chaos.empty());
}

// The chaos section below a config with 2 learners, its first line at line 3.
std::string WithChaos(const std::string& chaos) {
  return "data: {corpus: c.txt}\nsync: {learners: 2, quorum: 1}\n" + chaos;
}

TEST_CASE("chaos: each validation error names the place and the full key", "[unit][chaos]") {
  // Text after the two-line prefix -> the start of the message.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"chaos:\n  events:\n    - {at_s: 1, kill: {learner: 2}}\n",
       "run.yaml:5:33: chaos.events.0.kill.learner: 2 is not a learner: sync.learners is 2, so "
       "learners are 0 .. 1"},
      {"chaos:\n  events:\n    - {at_s: 1, drop: {learner: -3, prob: 0.1, duration_s: 1}}\n",
       "run.yaml:5:33: chaos.events.0.drop.learner: -3 is not a learner"},
      {"chaos:\n  events:\n    - {at_s: 1, slow: {learner: 0, factor: 0, duration_s: 1}}\n",
       "run.yaml:5:44: chaos.events.0.slow.factor: must be > 0"},
      {"chaos:\n  events:\n    - {at_s: 1, drop: {prob: 1.5, duration_s: 1}}\n",
       "run.yaml:5:30: chaos.events.0.drop.prob: must be in [0, 1], got 1.5"},
      {"chaos:\n  events:\n    - {at_s: 1, corrupt: {prob: -0.1, duration_s: 1}}\n",
       "run.yaml:5:33: chaos.events.0.corrupt.prob: must be in [0, 1], got -0.1"},
      {"chaos:\n  events:\n    - {at_s: 1, partition: {learner: 1, duration_s: 0}}\n",
       "run.yaml:5:53: chaos.events.0.partition.duration_s: must be > 0, got 0"},
      {"chaos:\n  events:\n    - {at_s: 1, syncer_kill: {shard: 1}}\n",
       "run.yaml:5:38: chaos.events.0.syncer_kill.shard: 1 is not a syncer shard: sync.syncers is 1, so shards are "
       "0 .. 0; leave it out for every shard"},
      {"chaos:\n  events:\n    - {at_s: -1, syncer_kill: {}}\n",
       "run.yaml:5:14: chaos.events.0.at_s: must be >= 0"},
      {"chaos:\n  events:\n    - {at_step: -2, kill: {learner: 0}}\n",
       "run.yaml:5:17: chaos.events.0.at_step: must be >= 0, got -2"},
      {"chaos:\n  events:\n    - {at_step: 5, drop: {prob: 0.1, duration_s: 1}}\n",
       "run.yaml:5:17: chaos.events.0.at_step: only kill, slow and partition fire at a step"},
      {"chaos:\n  events:\n    - {at_s: 1, at_step: 5, kill: {learner: 0}}\n",
       "run.yaml:5:17: chaos.events.0: has both at_s and at_step; keep one"},
      {"chaos:\n  events:\n    - {kill: {learner: 0}}\n",
       "run.yaml:5:7: chaos.events.0: needs a trigger: at_s"},
      {"chaos:\n  events:\n    - {at_s: 1, kill: {learner: 0}, slow: {learner: 0}}\n",
       "run.yaml:5:37: chaos.events.0: has two actions, kill and slow"},
      {"chaos:\n  events:\n    - {at_s: 1}\n",
       "run.yaml:5:7: chaos.events.0: needs an action: one of kill, slow, partition, drop, "
       "corrupt, "
       "syncer_kill"},
      {"chaos:\n  events:\n    - {at_s: 1, slow: {learner: 0, duration_s: 1}}\n",
       "run.yaml:5:17: chaos.events.0.slow.factor is required"},
      {"chaos:\n  events:\n    - {at_s: 1, kill: }\n",
       "run.yaml:5:17: chaos.events.0.kill.learner is required"},
      {"chaos:\n  events:\n    - {at_s: 1, kil: {learner: 0}}\n",
       "run.yaml:5:17: unknown key 'chaos.events.0.kil'; known keys in 'chaos.events.0': at_s, "
       "at_step, kill, slow, partition, drop, corrupt, syncer_kill; did you mean 'kill'?"},
      {"chaos:\n  events:\n    - {at_s: 1, kill: {learner: 0, restart_s: 1}}\n",
       "run.yaml:5:36: unknown key 'chaos.events.0.kill.restart_s'; known keys in "
       "'chaos.events.0.kill': learner, restart_after_s"},
      {"chaos:\n  events:\n    - {at_s: 1, kill: {learner: one}}\n",
       "run.yaml:5:33: chaos.events.0.kill.learner: expected an integer"},
      {"chaos:\n  events:\n    - {at_s: 1, kill: 3}\n",
       "run.yaml:5:23: chaos.events.0.kill: expected a section"},
      {"chaos:\n  events:\n    - at_s\n", "run.yaml:5:7: chaos.events.0: expected an event"},
      {"chaos:\n  events: {at_s: 1}\n", "run.yaml:4:11: chaos.events: expected a list of events"},
      {"chaos:\n  sead: 1\n",
       "run.yaml:4:3: unknown key 'chaos.sead'; known keys in 'chaos': "
       "seed, events, random; did you mean 'seed'?"},
      {"chaos:\n  random: {mtbf_s: -1}\n", "run.yaml:4:20: chaos.random.mtbf_s: must be >= 0"},
      {"chaos:\n  random: {mttr_s: 0}\n", "run.yaml:4:20: chaos.random.mttr_s: must be > 0"},
      {"chaos:\n  random: {from_s: -1}\n", "run.yaml:4:20: chaos.random.from_s: must be >= 0"},
      {"chaos:\n  random: {from_s: 10, until_s: 10}\n",
       "run.yaml:4:33: chaos.random.until_s: 10 is not after chaos.random.from_s 10"},
      {"chaos:\n  random: {mtbf_s: 5, mtbf: 1}\n",
       "run.yaml:4:23: unknown key 'chaos.random.mtbf'; known keys in 'chaos.random': mtbf_s, "
       "mttr_s, from_s, until_s; did you mean 'mtbf_s'?"},
  };
  for (const auto& [chaos, expected] : cases) {
    INFO(chaos);
    CHECK_THAT(ErrorOf(WithChaos(chaos)), StartsWith(expected));
  }

  // The learner index is checked against sync.learners even when chaos comes first.
  CHECK_THAT(ErrorOf("chaos:\n  events: [{at_s: 1, kill: {learner: 3}}]\n"
                     "data: {corpus: c.txt}\nsync: {learners: 3, quorum: 1}\n"),
             StartsWith("run.yaml:2:38: chaos.events.0.kill.learner: 3 is not a learner: "
                        "sync.learners is 3"));
  RunConfig config;
  REQUIRE(Parse("chaos:\n  events: [{at_s: 1, kill: {learner: 2}}]\n"
                "data: {corpus: c.txt}\nsync: {learners: 3, quorum: 1}\n",
                {}, &config)
              .ok());
}

TEST_CASE("chaos: the YAML form reads back equal", "[unit][chaos]") {
  RunConfig config;
  REQUIRE(Parse(kAllActions, {}, &config).ok());
  config.chaos.events[0].at_s = 0.1 + 0.2;      // no short decimal form
  config.chaos.events[0].restart_after_s = -5;  // "never", spelled other than the default
  const std::string yaml = RunConfigToYaml(config);
  INFO(yaml);
  CHECK_THAT(yaml, Contains("- {at_step: 200, slow: {learner: 2, factor: 3, duration_s: 20}}"));
  CHECK_THAT(yaml, Contains("- {at_s: 60, drop: {prob: 0.05, duration_s: 30}}"));  // learner: all
  CHECK_THAT(yaml, Contains("- {at_s: 90, syncer_kill: {}}"));
  RunConfig again;
  Status status = ParseRunConfig(yaml, "resolved.yaml", "/elsewhere", {}, &again);
  REQUIRE(status.message() == "");
  CHECK(again.chaos == config.chaos);
  CHECK(again == config);

  // No chaos: no section. Only a seed: still written, so that it survives.
  RunConfig plain;
  REQUIRE(Parse(testing::kMinimal, {}, &plain).ok());
  CHECK_THAT(RunConfigToYaml(plain), !Contains("chaos"));
  plain.chaos.seed = 9;
  REQUIRE(ParseRunConfig(RunConfigToYaml(plain), "r.yaml", "", {}, &again).ok());
  CHECK(again == plain);
}

TEST_CASE("chaos: --set reaches the seed, random and the whole event list", "[unit][chaos]") {
  RunConfig config;
  REQUIRE(Parse(testing::kMinimal,
                {"sync.learners=2", "chaos.seed=5", "chaos.random.mtbf_s=100",
                 "chaos.events=[{at_s: 3, kill: {learner: 1}}]"},
                &config)
              .ok());
  CHECK(config.chaos.seed == 5);
  CHECK(config.chaos.random.mtbf_s == 100);
  REQUIRE(config.chaos.events.size() == 1);
  CHECK(config.chaos.events[0] == Event(3, -1, ChaosEventKind::kKill, 1));
  CHECK_THAT(ErrorOf(testing::kMinimal, {"chaos.events=[{at_s: 3, kill: {learner: 1}}]"}),
             StartsWith("--set chaos.events=[{at_s: 3, kill: {learner: 1}}]: "
                        "chaos.events.0.kill.learner: 1 is not a learner"));
}

ChaosAction At(double time_s, ChaosActionKind kind, int learner, double value = 0) {
  return {kind, learner, value, time_s};
}

TEST_CASE("chaos: expansion orders actions by time and places every end", "[unit][chaos]") {
  RunConfig config;
  REQUIRE(Parse(kAllActions, {}, &config).ok());
  config.chaos.random = {};  // scripted events only
  using K = ChaosActionKind;
  const std::vector<ChaosAction> expected = {
      At(30, K::kKill, 1),
      At(40, K::kRestart, 1),
      At(50, K::kPartitionStart, 3),
      At(60, K::kPartitionEnd, 3),  // an end before a start at the same time
      At(60, K::kDropStart, -1, 0.05),
      At(60, K::kCorruptStart, 0, 0.01),
      At(70, K::kCorruptEnd, 0, 0.01),
      At(80, K::kSyncerKill, -1),
      At(85, K::kSyncerRestart, -1),
      At(90, K::kDropEnd, -1, 0.05),
      At(90, K::kSyncerKill, -1),  // never restarted
      // Step-triggered: the runner schedules the follow-up when it fires.
      {K::kKill, 0, 0, 0, 7, -1},
      {K::kSlowStart, 2, 3, 0, 200, 20},
  };
  const std::vector<ChaosAction> actions = ExpandChaos(config.chaos, 4, 1000);
  INFO(ChaosSummary(actions));
  CHECK(actions == expected);

  // Back-to-back windows of one learner, listed late first: the first ends before the second
  // starts. A zero restart delay still restarts after the kill.
  ChaosConfig chaos;
  ChaosEvent second = Event(20, -1, ChaosEventKind::kPartition, 0);
  second.duration_s = 5;
  ChaosEvent first = Event(10, -1, ChaosEventKind::kPartition, 0);
  first.duration_s = 10;
  ChaosEvent bounce = Event(100, -1, ChaosEventKind::kKill, 1);
  bounce.restart_after_s = 0;
  chaos.events = {bounce, second, first};
  const std::vector<ChaosAction> timeline = ExpandChaos(chaos, 2, 1000);
  REQUIRE(timeline.size() == 6);
  CHECK(timeline[0] == At(10, K::kPartitionStart, 0));
  CHECK(timeline[1] == At(20, K::kPartitionEnd, 0));
  CHECK(timeline[2] == At(20, K::kPartitionStart, 0));
  CHECK(timeline[3] == At(25, K::kPartitionEnd, 0));
  CHECK(timeline[4] == At(100, K::kKill, 1));
  CHECK(timeline[5].kind == K::kRestart);
  CHECK(timeline[5].time_s > 100);
  CHECK(timeline[5].time_s < 100.001);
}

TEST_CASE("chaos: the summary has one line per action", "[unit][chaos]") {
  RunConfig config;
  REQUIRE(Parse(kAllActions, {}, &config).ok());
  config.chaos.random = {};
  const std::string summary = ChaosSummary(ExpandChaos(config.chaos, 4, 1000));
  CHECK(std::count(summary.begin(), summary.end(), '\n') == 13);
  CHECK_THAT(summary, StartsWith("t=30s kill learner 1\nt=40s restart learner 1\n"));
  CHECK_THAT(summary, Contains("t=60s drop_start all learners prob 0.05\n"));
  CHECK_THAT(summary, Contains("t=80s syncer_kill\n"));
  CHECK_THAT(summary, Contains("step 200 slow_start learner 2 factor 3, slow_end 20s later\n"));
  CHECK_THAT(summary, Contains("step 7 kill learner 0\n"));
  CHECK(FollowUpOf(ChaosActionKind::kCorruptStart) == ChaosActionKind::kCorruptEnd);
  CHECK(FollowUpOf(ChaosActionKind::kRestart) == ChaosActionKind::kRestart);
}

// Each learner's random failures as (kill, restart) pairs, checking the alternation.
std::map<int, std::vector<std::pair<double, double>>> Outages(
    const std::vector<ChaosAction>& actions) {
  std::map<int, std::vector<std::pair<double, double>>> outages;
  std::map<int, double> down_since;
  for (const ChaosAction& a : actions) {
    if (a.kind == ChaosActionKind::kKill) {
      REQUIRE(down_since.count(a.learner) == 0);  // not killed twice without a restart
      down_since[a.learner] = a.time_s;
    } else {
      REQUIRE(a.kind == ChaosActionKind::kRestart);
      REQUIRE(down_since.count(a.learner) == 1);
      outages[a.learner].push_back({down_since[a.learner], a.time_s});
      down_since.erase(a.learner);
    }
  }
  CHECK(down_since.empty());  // every random failure is restarted
  return outages;
}

TEST_CASE("chaos: random failures are seeded, within the window and never overlap",
          "[unit][chaos]") {
  ChaosConfig chaos;
  chaos.random = {60, 5, 100, 2000};
  const std::vector<ChaosAction> a = ExpandChaos(chaos, 3, 1e9);
  CHECK(a == ExpandChaos(chaos, 3, 1e9));  // deterministic
  const auto outages = Outages(a);
  REQUIRE(outages.size() == 3);
  for (const auto& [learner, list] : outages) {
    INFO("learner " << learner);
    CHECK(list.size() > 10);
    double previous_restart = chaos.random.from_s;
    for (const auto& [kill, restart] : list) {
      CHECK(kill > previous_restart);  // after the previous outage ended (and from_s)
      CHECK(kill < chaos.random.until_s);
      CHECK(restart > kill);
      previous_restart = restart;
    }
  }
  CHECK(outages.at(0) != outages.at(1));  // each learner has its own stream

  ChaosConfig other = chaos;
  other.seed = 2;
  CHECK(ExpandChaos(other, 3, 1e9) != a);
  // Adding a learner leaves the others' failures as they were.
  CHECK(Outages(ExpandChaos(chaos, 4, 1e9)).at(2) == outages.at(2));

  // until_s 0: up to the horizon; no finite end: none at all; mtbf_s 0: off.
  chaos.random.until_s = 0;
  for (const ChaosAction& action : ExpandChaos(chaos, 1, 500)) {
    if (action.kind == ChaosActionKind::kKill) CHECK(action.time_s < 500);
  }
  CHECK(ExpandChaos(chaos, 1, std::numeric_limits<double>::infinity()).empty());
  chaos.random.mtbf_s = 0;
  CHECK(ExpandChaos(chaos, 3, 1e6).empty());
}

TEST_CASE("chaos: random up and down times have the configured means", "[unit][chaos]") {
  ChaosConfig chaos;
  chaos.seed = 7;
  chaos.random = {2.0, 0.5, 0, 0};
  // About 20000 failures: the sample means are within 2% of the truth by many standard errors
  // (1/sqrt(20000) = 0.7%), so a 10% bound cannot flake, while a wrong mean fails it.
  const auto outages = Outages(ExpandChaos(chaos, 1, 50000)).at(0);
  REQUIRE(outages.size() > 10000);
  double up_s = 0, down_s = 0, previous_restart = 0;
  for (const auto& [kill, restart] : outages) {
    up_s += kill - previous_restart;
    down_s += restart - kill;
    previous_restart = restart;
  }
  const double n = static_cast<double>(outages.size());
  CHECK(std::abs(up_s / n - chaos.random.mtbf_s) < 0.1 * chaos.random.mtbf_s);
  CHECK(std::abs(down_s / n - chaos.random.mttr_s) < 0.1 * chaos.random.mttr_s);
}

}  // namespace
}  // namespace diloco
