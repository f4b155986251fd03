// Which roles of a job run in one process, and on which devices: a pure function of the run
// config, used by the daemon (a site's share of a job's placement: control/job_lifecycle.cpp, whose
// roles take the plan's devices: control/roles.cpp) and by local mode (every role in one process:
// train/local_run.cpp, whose learners local_fleet.cpp runs).
//
// Devices: learner k of the process (k-th by index) gets train.ranks devices of its own from
// train.device on (RankDevice(train.device, k × ranks)), or all share train.device when they
// cannot own theirs (local mode with too few GPUs and one rank each; the CPU).
// Evaluation (the syncer's initial and final val loss, run once the learners have ended): on the
// first device of the process's first learner, and on "cpu" in a process that trains nothing
// (a syncer-only site). Local mode therefore evaluates on train.device, as does a daemon site that
// hosts the syncer and a learner.
#pragma once

#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/sync/shards.h"

namespace diloco {

struct PlannedRole {
  std::string name;          // "syncer" (or a shard's "syncer-<s>"), "learner-<i>"
  int learner = -1;          // its index in placement.learners (local: 0 .. sync.learners - 1); -1: a syncer
  bool ring_member = false;  // host h > 0's part of the learner's ring across its site's hosts
  std::string device;        // a learner: the first device of its ring; the syncer: where it evaluates
  int shard = -1;            // a syncer: which of the sync.syncers shards (shards.h)
};

struct RolePlan {
  std::vector<PlannedRole> roles;  // the syncer's shards first (those here), then learners by index
  std::string eval_device = "cpu";
  int roles_here = 0;  // the roles that share this machine's cores (threads_per_role each)
  int threads_per_role = 1;

  const PlannedRole* Find(const std::string& name) const;
};

// The roles host `host` of `site` runs for a job placed by cfg.placement; `cores` are the
// daemon's threads. The syncer shards placed on the site run on host 0; hosts 1 .. train.hosts - 1
// run ring members of the site's learners; other hosts run nothing.
RolePlan PlanSite(const RunConfig& cfg, const std::string& site, int host, int cores);

// Local mode: the syncer's shards and sync.learners learners in this process. own_devices: each learner has
// train.ranks GPUs of its own (LearnersOwnDevices); else they share train.device.
RolePlan PlanLocal(const RunConfig& cfg, bool own_devices, int cores);

// Which syncer shard merges which fragment of the run's model (sync.syncers, sync/shards.h), and
// each shard's share of the model's parameters (sum 1).
struct ShardLayout {
  ShardMap map;
  std::vector<double> shares;
};
ShardLayout ShardLayoutOf(const RunConfig& cfg);

// Whether `learners` learners of train.ranks ranks each find GPUs of their own on this machine
// (false on the CPU): PlanLocal's own_devices, as LearnerDevice (trainer.h) decides it.
bool LearnersOwnDevices(const TrainConfig& tc, int learners);

}  // namespace diloco
