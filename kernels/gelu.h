// GELU, tanh approximation (PyTorch's approximate="tanh", GPT-2's choice).
#pragma once

#include <cstddef>

namespace diloco {

// out (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n);

// OVERWRITES dinp (n).
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n);

}  // namespace diloco
