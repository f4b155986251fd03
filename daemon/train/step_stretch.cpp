#include "daemon/train/step_stretch.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "daemon/config/run_config.h"

namespace diloco {

StepStretch::StepStretch(const RunConfig& config, int learner)
    : slowdown_(LearnerConfigOf(config.learners, learner).slowdown),
      jitter_(LearnerConfigOf(config.learners, learner).jitter),
      rng_((uint64_t)config.train.seed * 0x9E3779B97F4A7C15ull + (uint64_t)learner + 1) {}

StretchedStep StepStretch::Apply(double step_s, double chaos_factor) {
  const double noise = jitter_ > 0 ? 1.0 + std::exponential_distribution<double>(1.0 / jitter_)(rng_) : 1.0;
  const double factor = std::max({1.0, slowdown_, chaos_factor}) * noise;
  const double provisioned = std::max(1.0, slowdown_) * noise;  // the same bits without a chaos factor
  if (factor > 1) std::this_thread::sleep_for(std::chrono::duration<double>((factor - 1) * step_s));
  return {step_s * factor, step_s * provisioned};
}

}  // namespace diloco
