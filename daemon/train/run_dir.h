// A run directory, written the same way by every mode and role (local `dilococtl train` and the
// daemon's roles alike):
//   config.yaml       the resolved run config (PrepareRunDir: its one writer)
//   learner-<i>.step  the last inner step learner i reached (rewritten atomically as it trains):
//                     what a resumed learner continues from
#pragma once

#include <string>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"

namespace diloco {

// Creates run_dir if missing and writes config.yaml atomically.
Status PrepareRunDir(const std::string& run_dir, const RunConfig& config);

std::string LearnerStepPath(const std::string& run_dir, int learner);
Status SaveLearnerStep(const std::string& run_dir, int learner, long step);
// The step learner `learner` reached, or 0 when it never recorded one. A damaged file is an error.
Status ReadLearnerStep(const std::string& run_dir, int learner, long* step);
// learner-<i>.ckpt: a learner's own parameters and AdamW moments (train.checkpoint_every), what
// a restarted learner takes its moments from (its parameters come from the syncer's snapshot).
std::string LearnerCheckpointPath(const std::string& run_dir, int learner);

}  // namespace diloco
