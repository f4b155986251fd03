// Local mode with several learners (sync.learners > 1): M learner threads and one syncer thread
// in one process, over the real ZeroMQ transport (inproc endpoints; each learner's sockets go
// through an emulated WAN link when any sync.link.* key is set). RunTraining dispatches here.
// The run directory gets config.yaml, metrics.jsonl (per-learner lines carry "learner"),
// events.log (the syncer's merge tape) and global_state.bin; the final validation loss is that
// of the syncer's global model.
// Modes: decoupled, diloco and streaming; ddp is rejected (not implemented in local mode yet).
#pragma once

#include "daemon/train/trainer.h"
#include "daemon/util/status.h"

namespace diloco {

struct LocalRunHooks {
  // Stop learner `crash_learner` (as if its site failed) once it has done `crash_after_steps`
  // steps; -1: nobody. For tests.
  int crash_learner = -1;
  long crash_after_steps = 0;
};

Status RunLocal(const TrainOptions& options, TrainSummary* summary, const LocalRunHooks& hooks = {});

}  // namespace diloco
