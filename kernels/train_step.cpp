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
  s.grad_norm = clip_grad_norm(model.grads(), model.num_params(), grad_clip);
  if (!std::isfinite(s.grad_norm)) return s;
  adamw_step(model.params(), model.grads(), optimizer, model.table(), hp);
  s.applied = true;
  return s;
}

}  // namespace diloco
