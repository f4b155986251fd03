// One optimizer step of the GPT: forward, backward, global-norm clipping,
// AdamW. Shared by the trainer, the learners and the tests.
#pragma once

#include "kernels/adamw.h"
#include "kernels/gpt.h"
#include "kernels/optimizer.h"

namespace diloco {

struct StepStats {
  double loss = 0.0;       // mean cross-entropy of the batch
  double grad_norm = 0.0;  // before clipping
  bool applied = false;    // false when loss or gradients were not finite
};

// Leaves the model and optimizer untouched when the loss or the gradient
// norm is NaN/Inf, so the caller can stop with the last good state.
StepStats train_step(Gpt& model, AdamWState& optimizer, const int* inputs, const int* targets, int B, int T,
                     const AdamWHyper& hp, double grad_clip);

}  // namespace diloco
