// Local mode under the virtual clock (sync.clock: virtual): the syncer and every learner of the
// run in one process, on the same cores as the wall-clock runtimes (syncer_core.h,
// learner_core.h), driven by one seeded discrete-event scheduler (scheduler.h) with the
// deployment of the config's `timing:` section. The model maths runs for real; time is virtual,
// so the same config, seed and train.threads give the same bits on any machine under any load.
// The summary's times (train_s, tokens_per_s, wall_s, goodput) are virtual; peak_rss_mb is 0
// (a property of the machine, printed apart by the caller).
#pragma once

#include "daemon/train/local_run.h"
#include "daemon/train/trainer.h"
#include "daemon/util/status.h"

namespace diloco {

// What the machine did for a virtual run (not part of the reproducible summary).
struct VirtualRunStats {
  uint64_t events = 0;   // scheduler events run
  double virtual_s = 0;  // virtual time from the start to the last learner's end
  double wall_s = 0;     // the machine's time for the whole run
};

Status RunVirtual(const TrainOptions& options, TrainSummary* summary, LocalRunDetails* details = nullptr,
                  VirtualRunStats* stats = nullptr);

}  // namespace diloco
