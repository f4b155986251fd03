// AdamW over a whole model: one moment buffer each, laid out like the
// parameters (same tensor table), and per-tensor weight-decay selection.
#pragma once

#include <vector>

#include "kernels/adamw.h"
#include "kernels/tensor_table.h"

namespace diloco {

struct AdamWState {
  std::vector<float> m, v;  // first and second moments, table layout
  long step = 0;            // AdamW steps taken (bias correction)
};

// One step: state.step += 1, then adamw_update on every tensor of the table,
// with hp.weight_decay on 2-D tensors and none on the rest.
void adamw_step(float* params, const float* grads, AdamWState& state,
                const TensorTable& table, const AdamWHyper& hp);

// The same step over the values [offset, offset + count) of the table only
// (a rank's shard): state.m, state.v and grads hold those count values,
// params points at the whole buffer. Every value gets the bits adamw_step
// gives it.
void adamw_step_range(float* params, const float* grads, AdamWState& state,
                      const TensorTable& table, const AdamWHyper& hp, size_t offset,
                      size_t count);

}  // namespace diloco
