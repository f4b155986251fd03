// How a slower or noisier site is emulated on one machine: after each step the
// learner sleeps, so its step takes
//   step_s × max(slowdown, chaos factor) × (1 + e),  e ~ Exponential(mean = jitter)
// (learners[i].slowdown and learners[i].jitter; e = 0 when jitter is 0). The
// exponential tail gives the occasional long step real stragglers show. The
// noise is drawn from (train.seed, learner index), so a run's stretches repeat.
#pragma once

#include <cstdint>
#include <random>

namespace diloco {

struct RunConfig;

struct StretchedStep {
  double step_s = 0;         // the step as it ran: stretched by the slowdown or a chaos slowdown, and the noise
  double provisioned_s = 0;  // the same without the chaos slowdown (a fault): goodput's nominal time
};

class StepStretch {
 public:
  StepStretch(const RunConfig& config, int learner);
  // The larger of learners[i].slowdown and `chaos_factor` (1 = none) sets the stretch.
  // Sleeps the extra time and returns the stretched step time.
  StretchedStep Apply(double step_s, double chaos_factor = 1.0);

 private:
  double slowdown_, jitter_;
  std::mt19937_64 rng_;
};

}  // namespace diloco
