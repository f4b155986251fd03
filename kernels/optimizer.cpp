#include "kernels/optimizer.h"

#include <algorithm>

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

void adamw_step_range(float* params, const float* grads, AdamWState& state,
                      const TensorTable& table, const AdamWHyper& hp, size_t offset,
                      size_t count) {
  DL_CHECK(offset + count <= table.total_numel(), "shard [%zu, +%zu) outside %zu", offset, count,
           table.total_numel());
  if (state.m.size() != count) state.m.assign(count, 0.0f);
  if (state.v.size() != count) state.v.assign(count, 0.0f);
  state.step += 1;
  const size_t end = offset + count;
  for (const TensorInfo& t : table.tensors()) {
    const size_t lo = std::max(offset, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    AdamWHyper h = hp;
    if (!gpt_tensor_decays(t)) h.weight_decay = 0.0f;
    adamw_update(params + lo, state.m.data() + (lo - offset), state.v.data() + (lo - offset),
                 grads + (lo - offset), hi - lo, h, state.step);
  }
}

}  // namespace diloco
