// The daemon-mode chaos commands (control/site_chaos.h): parsing and its refusals, what undoes
// what, and how a job's chaos timeline maps onto the sites of its placement.
#include "daemon/control/site_chaos.h"

#include <catch2/catch.hpp>

namespace diloco {
namespace {

SiteChaosCommand Parsed(const ControlArgs& args) {
  SiteChaosCommand c;
  const Status st = ParseSiteChaos(args, &c);
  INFO(st.message());
  REQUIRE(st.ok());
  return c;
}

std::string Refusal(const ControlArgs& args) {
  SiteChaosCommand c;
  const Status st = ParseSiteChaos(args, &c);
  REQUIRE_FALSE(st.ok());
  return st.message();
}

}  // namespace

TEST_CASE("a chaos command round-trips through its control arguments", "[unit]") {
  SiteChaosCommand c;
  c.action = SiteChaosAction::kDrop;
  c.site = "site-b";
  c.learner = 3;
  c.value = 0.25;
  c.duration_s = 7.5;
  const SiteChaosCommand back = Parsed(SiteChaosArgs(c));
  CHECK(back.action == SiteChaosAction::kDrop);
  CHECK(back.site == "site-b");
  CHECK(back.learner == 3);
  CHECK(back.value == 0.25);
  CHECK(back.duration_s == 7.5);
  CHECK(back.restart_after_s == -1);
  CHECK_FALSE(back.syncer);
  CHECK(Describe(back) == "drop learner-3 on site-b (p=0.25) for 7.5 s");
}

TEST_CASE("chaos commands that make no sense are refused, naming what is wrong", "[unit]") {
  const ControlArgs kill = {{"action", "kill"}, {"site", "s"}};
  auto with = [&](ControlArgs a, const std::string& k, const std::string& v) {
    a[k] = v;
    return a;
  };
  CHECK_THAT(Refusal(with(kill, "action", "explode")), Catch::Contains("unknown action 'explode'"));
  CHECK_THAT(Refusal(with(kill, "site", "")), Catch::Contains("which site"));
  CHECK_THAT(Refusal(with(kill, "learner", "1.5")), Catch::Contains("learner index"));
  CHECK_THAT(Refusal(with(kill, "learner", "x")), Catch::Contains("'x' is not a number"));
  CHECK_THAT(Refusal(with(with(kill, "syncer", "1"), "learner", "0")), Catch::Contains("not both"));
  CHECK_THAT(Refusal({{"action", "slow"}, {"site", "s"}, {"syncer", "1"}}), Catch::Contains("acts on learners"));
  CHECK_THAT(Refusal({{"action", "slow"}, {"site", "s"}, {"value", "-2"}}), Catch::Contains("factor"));
  CHECK_THAT(Refusal({{"action", "drop"}, {"site", "s"}, {"value", "1.5"}}), Catch::Contains("probability in [0, 1]"));
  CHECK_THAT(Refusal({{"action", "corrupt"}, {"site", "s"}, {"value", "nan"}}), Catch::Contains("not a number"));
  CHECK_THAT(Refusal(with(with(kill, "process", "1"), "restart_after_s", "5")), Catch::Contains("supervisor"));
  CHECK_THAT(Refusal(with(with(kill, "process", "1"), "learner", "0")), Catch::Contains("whole dilocod"));
  CHECK_THAT(Refusal({{"action", "slow"}, {"site", "s"}, {"process", "1"}}), Catch::Contains("kill only"));
  CHECK_THAT(Refusal(with(kill, "duration_s", "1e9")), Catch::Contains("at most 1e7"));
}

TEST_CASE("what undoes a chaos command, and when", "[unit]") {
  struct Row {
    ControlArgs args;
    bool has_undo;
    SiteChaosAction undo;
    double value, after_s;
  };
  const Row rows[] = {
      {{{"action", "kill"}, {"site", "s"}, {"restart_after_s", "10"}}, true, SiteChaosAction::kRestart, 0, 10},
      {{{"action", "kill"}, {"site", "s"}, {"restart_after_s", "0"}}, true, SiteChaosAction::kRestart, 0, 0},
      {{{"action", "kill"}, {"site", "s"}}, false, {}, 0, 0},  // never restarted
      {{{"action", "kill"}, {"site", "s"}, {"process", "1"}}, false, {}, 0, 0},
      {{{"action", "slow"}, {"site", "s"}, {"value", "3"}, {"duration_s", "20"}}, true, SiteChaosAction::kSlow, 0, 20},
      {{{"action", "slow"}, {"site", "s"}, {"value", "3"}}, false, {}, 0, 0},  // until told
      {{{"action", "partition"}, {"site", "s"}, {"duration_s", "5"}}, true, SiteChaosAction::kHeal, 0, 5},
      {{{"action", "drop"}, {"site", "s"}, {"value", "0.1"}, {"duration_s", "3"}}, true, SiteChaosAction::kDrop, 0, 3},
      {{{"action", "corrupt"}, {"site", "s"}, {"value", "0.1"}, {"duration_s", "2"}}, true, SiteChaosAction::kCorrupt, 0, 2},
      {{{"action", "heal"}, {"site", "s"}, {"duration_s", "2"}}, false, {}, 0, 0},
      {{{"action", "restart"}, {"site", "s"}}, false, {}, 0, 0},
  };
  for (const Row& row : rows) {
    const SiteChaosCommand c = Parsed(row.args);
    INFO(Describe(c));
    double after_s = -1;
    const std::optional<SiteChaosCommand> undo = UndoOf(c, &after_s);
    REQUIRE(undo.has_value() == row.has_undo);
    if (!undo) continue;
    CHECK(undo->action == row.undo);
    CHECK(undo->value == row.value);
    CHECK(after_s == row.after_s);
    CHECK(undo->site == c.site);
    CHECK(undo->duration_s < 0);  // an undo is not undone again
    CHECK(undo->restart_after_s < 0);
  }
}

TEST_CASE("a job's chaos timeline goes to the sites its placement names", "[unit]") {
  const std::vector<std::string> learners = {"site-a", "site-b", "site-a"};
  auto one = [&](ChaosActionKind kind, int learner, double value = 0) {
    const std::vector<SiteChaosCommand> out = SiteChaosOf({kind, learner, value}, learners, {"site-s"});
    REQUIRE(out.size() == 1);
    return out[0];
  };
  SiteChaosCommand c = one(ChaosActionKind::kKill, 1);
  CHECK((c.action == SiteChaosAction::kKill && c.site == "site-b" && c.learner == 1 && !c.syncer));
  CHECK(c.restart_after_s < 0);  // the timeline sends the restart itself
  c = one(ChaosActionKind::kRestart, 2);
  CHECK((c.action == SiteChaosAction::kRestart && c.site == "site-a" && c.learner == 2));
  c = one(ChaosActionKind::kSlowStart, 0, 3);
  CHECK((c.action == SiteChaosAction::kSlow && c.value == 3 && c.site == "site-a"));
  c = one(ChaosActionKind::kPartitionEnd, 1);
  CHECK((c.action == SiteChaosAction::kHeal && c.site == "site-b"));
  c = one(ChaosActionKind::kSyncerKill, -1);
  CHECK((c.action == SiteChaosAction::kKill && c.syncer && c.site == "site-s" && c.learner == -1));
  c = one(ChaosActionKind::kSyncerRestart, -1);
  CHECK((c.action == SiteChaosAction::kRestart && c.syncer && c.site == "site-s"));
  // Every learner's link: one command per learner site, each for every learner there.
  const std::vector<SiteChaosCommand> drops = SiteChaosOf({ChaosActionKind::kDropStart, -1, 0.05}, learners, {"site-s"});
  REQUIRE(drops.size() == 2);
  CHECK((drops[0].site == "site-a" && drops[1].site == "site-b"));
  for (const SiteChaosCommand& d : drops) CHECK((d.action == SiteChaosAction::kDrop && d.value == 0.05 && d.learner == -1));
  // A learner the placement does not have: nothing to send.
  CHECK(SiteChaosOf({ChaosActionKind::kKill, 7, 0}, learners, {"site-s"}).empty());
}

}  // namespace diloco
