// Token + position embedding. Shapes: see shapes.h.
#pragma once

namespace diloco {

// out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (T,C).
template <typename F>
void encoder_forward(F* out, const int* tokens, const F* wte, const F* wpe,
                     int B, int T, int C);

// ADDS to dwte (V,C) and dwpe (T,C) from dout (B,T,C). Parallel over
// channels, so the sum order (and the result) does not depend on threads.
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int* tokens,
                      int B, int T, int C);

}  // namespace diloco
