// LayerNorm over the last dimension (eps 1e-5, as PyTorch). Shapes: shapes.h.
#pragma once

namespace diloco {

// out (N,C) = (inp - mean) * rstd * weight + bias; saves mean (N), rstd (N).
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight,
                       const F* bias, int N, int C);

// ADDS to dinp (N,C), dweight (C), dbias (C).
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout,
                        const F* inp, const F* weight, const F* mean,
                        const F* rstd, int N, int C);

}  // namespace diloco
