#include "kernels/optimizer.h"

#include "kernels/check.h"
#include "kernels/gpt.h"

namespace diloco {

void adamw_step(float* params, const float* grads, AdamWState& state,
                const TensorTable& table, const AdamWHyper& hp) {
  const size_t n = table.total_numel();
  if (state.m.size() != n) state.m.assign(n, 0.0f);
  if (state.v.size() != n) state.v.assign(n, 0.0f);
  state.step += 1;
  for (const TensorInfo& t : table.tensors()) {
    AdamWHyper h = hp;
    if (!gpt_tensor_decays(t)) h.weight_decay = 0.0f;
    adamw_update(params + t.offset, state.m.data() + t.offset, state.v.data() + t.offset,
                 grads + t.offset, t.numel, h, state.step);
  }
}

}  // namespace diloco
