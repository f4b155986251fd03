// The register-tile attention for a head size of 64 (attention_mma.cu):
// attention.cu's fast path, behind the same attention_forward/backward.
#pragma once
#include <initializer_list>

#include "kernels/cuda/ops.h"

namespace diloco::cuda {

// Head size 64 (C == 64 * NH) and 16-byte aligned rows at every pointer given.
bool attention_mma_supported(int C, int NH, std::initializer_list<const void*> pointers);
void attention_forward_mma(bf16* out, float* lse, const bf16* inp, int B, int T, int C, int NH, Stream stream);
// D: rowsum(dout * out) per (b, h, t), as attention.cu computes it.
void attention_backward_mma(bf16* dinp, const bf16* dout, const bf16* inp, const float* lse, const float* D, int B,
                            int T, int C, int NH, Stream stream);

}  // namespace diloco::cuda
