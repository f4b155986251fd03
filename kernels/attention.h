// Causal multi-head self-attention (no projections: those are matmuls).
// Shapes: shapes.h. inp (B,T,3C) holds [q | k | v] per position, head h
// using channels [h*hs, (h+1)*hs) of each; scale = 1/sqrt(hs).
#pragma once

namespace diloco {

// out (B,T,C) = softmax(q k^T * scale, causal) v per head; saves the
// probabilities att (B,NH,T,T), zero above the diagonal.
template <typename F>
void attention_forward_reference(F* out, F* att, const F* inp, int B, int T,
                                 int C, int NH);

// OVERWRITES dinp (B,T,3C).
template <typename F>
void attention_backward_reference(F* dinp, const F* dout, const F* inp,
                                  const F* att, int B, int T, int C, int NH);

// Fast paths: the same contracts, one gemm() per head and batch row.
void attention_forward(float* out, float* att, const float* inp, int B, int T,
                       int C, int NH);
void attention_backward(float* dinp, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH);

}  // namespace diloco
