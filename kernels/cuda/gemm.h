// Linear layers on the GPU through cuBLASLt (CPU: kernels/cpu/matmul.cpp,
// same contracts as kernels/matmul.h): bf16 inputs, fp32 accumulation,
// bias and GELU fused into the GEMM's epilogue where cuBLASLt offers one
// for the shape (otherwise separate kernels do the same math).
// Plain C++ header; the cuBLASLt handle lives behind a pimpl.
#pragma once

#include <memory>

#include "kernels/cuda/ops.h"

namespace diloco::cuda {

class Gemm {
 public:
  // Needs a current CUDA device; aborts with the error if cuBLASLt fails.
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC; may be null), bf16.
  // With pre_gelu (N,OC): pre_gelu = that sum and out = gelu(pre_gelu).
  void matmul_forward(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight, const bf16* bias, int N,
                      int C, int OC, Stream stream);

  // OVERWRITES dinp (N,C) (bf16; skipped when null); ADDS to dweight (OC,C)
  // and dbias (OC; may be null), both fp32. scratch holds
  // bias_backward_scratch_floats(N, OC) floats (unused without dbias).
  void matmul_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout, const bf16* inp,
                       const bf16* weight, int N, int C, int OC, Stream stream);

  // How many forward GEMMs fell back from a fused epilogue, and how many
  // GEMMs ran on the slow kernel because cuBLASLt had no algorithm (logs).
  long epilogue_fallbacks() const;
  long naive_fallbacks() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace diloco::cuda
