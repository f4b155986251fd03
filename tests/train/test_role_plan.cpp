#include <catch2/catch.hpp>

#include "daemon/train/role_plan.h"

namespace diloco {
namespace {

RunConfig Placed(const std::string& syncer, std::vector<std::string> learners, const std::string& device) {
  RunConfig cfg;
  cfg.placement.syncer = {syncer};
  cfg.placement.learners = std::move(learners);
  cfg.train.device = device;
  cfg.train.ranks = 1;
  cfg.train.hosts = 1;
  return cfg;
}

std::vector<std::string> Names(const RolePlan& plan) {
  std::vector<std::string> out;
  for (const PlannedRole& r : plan.roles) out.push_back(r.name + (r.ring_member ? "(member)" : "") + "@" + r.device);
  return out;
}

TEST_CASE("a site's plan: the syncer first, its learners by index with their own GPUs", "[unit]") {
  const RunConfig cfg = Placed("s", {"a", "s", "a"}, "cuda:0");
  const RolePlan s = PlanSite(cfg, "s", 0, 8);
  CHECK(Names(s) == std::vector<std::string>{"syncer@cuda:0", "learner-1@cuda:0"});
  CHECK(s.eval_device == "cuda:0");  // after its learner ended, on that learner's GPU
  CHECK(s.roles_here == 2);
  CHECK(s.threads_per_role == 4);
  const RolePlan a = PlanSite(cfg, "a", 0, 8);
  CHECK(Names(a) == std::vector<std::string>{"learner-0@cuda:0", "learner-2@cuda:1"});
  CHECK(a.Find("learner-2")->learner == 2);
  CHECK(a.Find("syncer") == nullptr);
  CHECK(PlanSite(cfg, "elsewhere", 0, 8).roles_here == 0);
}

TEST_CASE("a syncer-only site evaluates on its CPU; rings of two ranks take two GPUs each", "[unit]") {
  RunConfig cfg = Placed("s", {"a", "a"}, "cuda:2");
  cfg.train.ranks = 2;
  const RolePlan s = PlanSite(cfg, "s", 0, 4);
  CHECK(Names(s) == std::vector<std::string>{"syncer@cpu"});
  CHECK(s.eval_device == "cpu");
  CHECK(s.threads_per_role == 4);
  CHECK(Names(PlanSite(cfg, "a", 0, 4)) == std::vector<std::string>{"learner-0@cuda:2", "learner-1@cuda:4"});
}

TEST_CASE("hosts of a site: the syncer on host 0, ring members on the hosts the rings span", "[unit]") {
  RunConfig cfg = Placed("s", {"s", "s"}, "cpu");
  cfg.train.hosts = 2;
  CHECK(Names(PlanSite(cfg, "s", 0, 2)) == std::vector<std::string>{"syncer@cpu", "learner-0@cpu", "learner-1@cpu"});
  CHECK(Names(PlanSite(cfg, "s", 1, 2)) == std::vector<std::string>{"learner-0(member)@", "learner-1(member)@"});
  CHECK(PlanSite(cfg, "s", 2, 2).roles.empty());  // a third host: no ring spans it
  CHECK(PlanSite(cfg, "s", 1, 2).threads_per_role == 1);
}

TEST_CASE("local mode: every role in the process, learners own or share the GPUs, eval on train.device", "[unit]") {
  RunConfig cfg;
  cfg.sync.learners = 3;
  cfg.train.device = "cuda:0";
  cfg.train.ranks = 1;
  const RolePlan own = PlanLocal(cfg, true, 12);
  CHECK(Names(own) == std::vector<std::string>{"syncer@cuda:0", "learner-0@cuda:0", "learner-1@cuda:1", "learner-2@cuda:2"});
  CHECK(own.eval_device == "cuda:0");
  CHECK(own.threads_per_role == 4);
  const RolePlan shared = PlanLocal(cfg, false, 2);
  CHECK(Names(shared) == std::vector<std::string>{"syncer@cuda:0", "learner-0@cuda:0", "learner-1@cuda:0", "learner-2@cuda:0"});
  CHECK(shared.threads_per_role == 1);
  cfg.train.device = "cpu";
  CHECK(PlanLocal(cfg, false, 4).eval_device == "cpu");
}

TEST_CASE("a site's plan runs the syncer shards placed on it", "[unit]") {
  RunConfig cfg = Placed("s", {"a", "b"}, "cpu");
  cfg.sync.fragments = 4;
  cfg.sync.syncers = 3;
  cfg.placement.syncer = {"s", "a", "s"};
  CHECK(Names(PlanSite(cfg, "s", 0, 8)) == std::vector<std::string>{"syncer-0@cpu", "syncer-2@cpu"});
  const RolePlan a = PlanSite(cfg, "a", 0, 8);
  CHECK(Names(a) == std::vector<std::string>{"syncer-1@cpu", "learner-0@cpu"});
  CHECK(a.roles[0].shard == 1);
  CHECK(Names(PlanSite(cfg, "b", 0, 8)) == std::vector<std::string>{"learner-1@cpu"});
  // Local mode: every shard.
  cfg.sync.learners = 2;
  CHECK(Names(PlanLocal(cfg, false, 2)) ==
        std::vector<std::string>{"syncer-0@cpu", "syncer-1@cpu", "syncer-2@cpu", "learner-0@cpu", "learner-1@cpu"});
}

}  // namespace
}  // namespace diloco
