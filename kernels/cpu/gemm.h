// Row-major single-precision GEMM for the CPU backend:
//   C (M,N) = alpha * op(A) (M,K) * op(B) (K,N) + beta * C
// Runs on the calling thread only: callers split work across OpenMP threads
// themselves, so BLAS threads never compete with ours for the cores.
// Uses CBLAS (OpenBLAS) when built with it, else a plain loop.
#pragma once

namespace diloco {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta,
          float* C, int ldc);

// True when gemm() goes through a BLAS library.
bool gemm_uses_blas();

}  // namespace diloco
