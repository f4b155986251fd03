#include "kernels/train_step.h"

#include <cmath>

#include "kernels/grad_clip.h"

namespace diloco {

StepStats train_step(Gpt& model, AdamWState& optimizer, const int* inputs, const int* targets, int B, int T,
                     const AdamWHyper& hp, double grad_clip) {
  StepStats s;
  s.loss = model.forward(inputs, targets, B, T);
  if (!std::isfinite(s.loss)) return s;
  model.zero_grad();
  model.backward();
  s.grad_norm = global_norm(model.grads(), model.num_params());
  if (!std::isfinite(s.grad_norm)) return s;
  AdamWHyper clipped = hp;
  clipped.grad_scale = hp.grad_scale * clip_scale(s.grad_norm, grad_clip);
  adamw_step(model.params(), model.grads(), optimizer, model.table(), clipped);
  s.applied = true;
  return s;
}

}  // namespace diloco
