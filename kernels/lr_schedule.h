// Learning-rate schedule: linear warmup, then cosine decay to min_lr
// (nanoGPT's get_lr).
#pragma once

namespace diloco {

struct LrSchedule {
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int warmup_steps = 0;
  int decay_steps = 0;  // step at which the cosine reaches min_lr
};

// Learning rate for the 0-based step.
float lr_at(const LrSchedule& s, int step);

}  // namespace diloco
