// Linear layer: out = inp @ weight^T + bias, weight stored (OC,C) as in
// PyTorch. Shapes: shapes.h.
#pragma once

namespace diloco {

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null.
// Reference: plain loops.
template <typename F>
void matmul_forward_reference(F* out, const F* inp, const F* weight,
                              const F* bias, int N, int C, int OC);

// OVERWRITES dinp (N,C); ADDS to dweight (OC,C) and dbias (OC; may be null).
template <typename F>
void matmul_backward_reference(F* dinp, F* dweight, F* dbias, const F* dout,
                               const F* inp, const F* weight, int N, int C,
                               int OC);

// Fast paths: the same contracts, through gemm().
void matmul_forward(float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight,
                     int N, int C, int OC);

}  // namespace diloco
