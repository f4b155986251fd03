// A learner's inner step under the virtual clock: how long it takes, drawn the same way by the
// threaded virtual learner (its maths on) and the timed one of `dilococtl simulate` (maths off).
#pragma once

#include <cstdint>

#include "daemon/config/run_config.h"
#include "kernels/rng.h"

namespace diloco {

struct VirtualStep {
  double base_s = 0;  // the step's own time: timing.step_ms x (1 +- step_jitter), what goodput's
                      // nominal rate counts
  int64_t ns = 0;     // what it takes: base x learners[i].slowdown x (1 + e)
};

// timing.step_ms x (1 + u), u uniform in [-step_jitter, step_jitter], then x learners[i].slowdown
// x (1 + e), e exponential with mean learners[i].jitter (the wall runtime's stretch). Both draws
// every step, so one learner's draws do not depend on its settings.
VirtualStep DrawVirtualStep(const RunConfig& cfg, int learner, Rng& rng);

}  // namespace diloco
