// Chaos in daemon mode: faults injected on purpose into a running job's roles on one site, by
// `dilococtl chaos JOB ACTION SITE ...` or by the job's own `chaos:` section (played at the
// syncer's site, each action sent to the site of the learner it names). A site takes them only
// when its daemon config says `chaos: true` (test clusters: every action here is destructive).
//
//   kill       the roles of the job on the site stop dead, as if the site failed: a learner sends
//              nothing more, the syncer merges and saves nothing more (its update log remains);
//              restart_after_s >= 0 starts them again from what is on disk (a learner joins from
//              the syncer's snapshot at its recorded step; the syncer replays its update log).
//              process: the site's dilocod itself gets SIGKILL (systemd restarts it: Restart=).
//   restart    the killed roles start again now.
//   slow       the learners' steps stretched by value (a factor; 0: back to the config's).
//   partition  the learners' links drop everything both ways; heal ends it.
//   drop       the learners' links drop each message with probability value (0: back to normal).
//   corrupt    the same, flipping a byte of the message instead.
// Which roles: learner >= 0 names one learner of the job (it must be on the site); syncer names
// the job's syncer (kill and restart only); neither: every role of the job on the site (kill,
// restart) or every learner there (the rest).
// A duration_s > 0 (slow, partition, drop, corrupt) undoes the action that much later
// (UndoOf), as a kill's restart_after_s restarts.
#pragma once

#include <optional>
#include <string>

#include "daemon/config/chaos_config.h"
#include "daemon/control/control_protocol.h"
#include "daemon/util/status.h"

namespace diloco {

enum class SiteChaosAction { kKill, kRestart, kSlow, kPartition, kHeal, kDrop, kCorrupt };
const char* ToString(SiteChaosAction action);

struct SiteChaosCommand {
  SiteChaosAction action = SiteChaosAction::kKill;
  std::string site;              // where the roles run
  int learner = -1;              // one learner of the job; -1: see above
  bool syncer = false;           // the job's syncer (kill, restart)
  bool process = false;          // kill: the daemon process itself
  double value = 0;              // slow: factor; drop, corrupt: probability
  double duration_s = -1;        // > 0: undone this much later
  double restart_after_s = -1;   // kill: >= 0 restarts this much later
};

// The control request's arguments and back; Parse checks every field and says which is wrong.
ControlArgs SiteChaosArgs(const SiteChaosCommand& command);
Status ParseSiteChaos(const ControlArgs& args, SiteChaosCommand* out);

// What undoes command after its duration_s or restart_after_s (and that delay), if anything.
std::optional<SiteChaosCommand> UndoOf(const SiteChaosCommand& command, double* after_s);

// "kill learner-1 on site-b (restart after 10 s)", for logs and replies.
std::string Describe(const SiteChaosCommand& command);

// One action of a job's chaos timeline (ExpandChaos) as the command for the site that runs the
// learner it names (placement_learners[i]) or the syncer (one command per site of syncer_sites,
// those of the shards it hits). Drop and corrupt on every learner (learner -1) give one command
// per learner site, so this returns a list.
std::vector<SiteChaosCommand> SiteChaosOf(const ChaosAction& action, const std::vector<std::string>& placement_learners,
                                          const std::vector<std::string>& syncer_sites);

}  // namespace diloco
