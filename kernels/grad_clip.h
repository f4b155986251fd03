// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_). The
// scale is applied inside the AdamW update (AdamWHyper::grad_scale), which
// saves a pass over the gradients.
#pragma once

#include <cstddef>

namespace diloco {

// L2 norm of x (n), summed in double over fixed-size chunks: the result is
// bitwise the same for any thread count.
double global_norm(const float* x, size_t n);

// The factor that brings a gradient of this norm down to max_norm: 1 when
// norm <= max_norm or max_norm <= 0 (clipping off).
float clip_scale(double norm, double max_norm);

}  // namespace diloco
