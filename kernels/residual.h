// Residual add. Its backward is the identity into both inputs; the model
// gets that for free by letting both consumers share one gradient buffer.
#pragma once

#include <cstddef>

namespace diloco {

// out (n) = a + b.
template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n);

}  // namespace diloco
