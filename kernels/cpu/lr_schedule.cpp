#include "kernels/lr_schedule.h"

#include <cmath>

namespace diloco {

float lr_at(const LrSchedule& s, int step) {
  if (step < s.warmup_steps) return s.lr * (float)(step + 1) / (float)(s.warmup_steps + 1);
  if (step >= s.decay_steps) return s.min_lr;
  const double ratio = (double)(step - s.warmup_steps) / (double)(s.decay_steps - s.warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return (float)(s.min_lr + coeff * (s.lr - s.min_lr));
}

}  // namespace diloco
