#include "daemon/virt/virtual_step.h"

#include <cmath>

namespace diloco {

VirtualStep DrawVirtualStep(const RunConfig& cfg, int learner, Rng& rng) {
  const double u = rng.uniform(), v = rng.uniform();
  const double base_ms = cfg.timing.step_ms * (1 + cfg.timing.step_jitter * (2 * u - 1));
  const LearnerConfig lc = LearnerConfigOf(cfg.learners, learner);
  const double e = lc.jitter > 0 ? -lc.jitter * std::log1p(-v) : 0;
  return {base_ms / 1e3, (int64_t)std::llround(base_ms * lc.slowdown * (1 + e) * 1e6)};
}

}  // namespace diloco
