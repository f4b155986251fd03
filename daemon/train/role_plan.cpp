#include "daemon/train/role_plan.h"

#include <algorithm>

#include "daemon/sync/protocol.h"
#include "daemon/sync/shards.h"
#include "daemon/train/trainer.h"
#include "kernels/backend.h"
#include "kernels/gpt.h"

namespace diloco {
namespace {

// Devices and the evaluation rule (role_plan.h), once the roles are listed.
void SetDevices(const RunConfig& cfg, bool own_devices, RolePlan* plan) {
  int k = 0;  // learners of this process so far
  for (PlannedRole& r : plan->roles) {
    if (r.learner < 0 || r.ring_member) continue;
    r.device = own_devices ? RankDevice(cfg.train.device, k * cfg.train.ranks) : cfg.train.device;
    if (k++ == 0) plan->eval_device = r.device;
  }
  for (PlannedRole& r : plan->roles)
    if (r.learner < 0) r.device = plan->eval_device;
}

}  // namespace

const PlannedRole* RolePlan::Find(const std::string& name) const {
  auto it = std::find_if(roles.begin(), roles.end(), [&](const PlannedRole& r) { return r.name == name; });
  return it == roles.end() ? nullptr : &*it;
}

RolePlan PlanSite(const RunConfig& cfg, const std::string& site, int host, int cores) {
  RolePlan plan;
  const int S = cfg.sync.syncers;
  const std::vector<int> shards_here = cfg.placement.ShardsOn(site, S);
  plan.roles_here =
      (int)shards_here.size() + (int)std::count(cfg.placement.learners.begin(), cfg.placement.learners.end(), site);
  plan.threads_per_role = std::max(1, cores / std::max(1, plan.roles_here));
  if (host == 0)
    for (int s : shards_here) plan.roles.push_back({SyncerShardName(s, S), -1, false, "", s});
  for (size_t i = 0; i < cfg.placement.learners.size(); i++) {
    if (cfg.placement.learners[i] != site) continue;
    if (host > 0 && host >= cfg.train.hosts) continue;  // a host the learner's ring does not span
    plan.roles.push_back({LearnerName((int)i), (int)i, host > 0, ""});
  }
  SetDevices(cfg, /*own_devices=*/true, &plan);  // the site's devices fit its learners (CheckJobFitsSite)
  return plan;
}

RolePlan PlanLocal(const RunConfig& cfg, bool own_devices, int cores) {
  RolePlan plan;
  const int learners = cfg.sync.learners;
  plan.roles_here = learners;  // the syncer's work is light next to theirs
  plan.threads_per_role = std::max(1, cores / std::max(1, learners));
  for (int s = 0; s < cfg.sync.syncers; s++) plan.roles.push_back({SyncerShardName(s, cfg.sync.syncers), -1, false, "", s});
  for (int i = 0; i < learners; i++) plan.roles.push_back({LearnerName(i), i, false, ""});
  SetDevices(cfg, own_devices, &plan);
  return plan;
}

ShardLayout ShardLayoutOf(const RunConfig& cfg) {
  std::vector<Fragment> frags;
  ShardLayout out;
  if (!PartitionFragments(gpt_tensor_table(GptConfigOf(cfg.model)), EffectiveFragments(cfg.sync), &frags).ok())
    return out;
  out.map = ShardMap::Of(frags, cfg.sync.syncers);
  out.shares.assign(out.map.shards(), 0.0);
  const std::vector<double> weights = FragmentWeights(frags);
  for (size_t p = 0; p < frags.size(); p++) out.shares[out.map.OwnerOf(p)] += weights[p];
  return out;
}

bool LearnersOwnDevices(const TrainConfig& tc, int learners) {
  return tc.device != "cpu" && CheckDeviceAvailable(tc.device, learners * tc.ranks).empty();
}

}  // namespace diloco
