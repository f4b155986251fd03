// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_).
#pragma once

#include <cstddef>

namespace diloco {

// L2 norm of x (n), summed in double over fixed-size chunks: the result is
// bitwise the same for any thread count.
double global_norm(const float* x, size_t n);

// Scales grads by max_norm / norm when norm > max_norm (max_norm <= 0: off).
// Returns the norm before clipping.
double clip_grad_norm(float* grads, size_t n, double max_norm);

}  // namespace diloco
