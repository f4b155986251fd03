#include "kernels/cpu/gemm.h"

#ifdef DILOCO_HAVE_BLAS
#include <cblas.h>
#endif

#include <mutex>

namespace diloco {

#ifdef DILOCO_HAVE_BLAS

namespace {
// OpenBLAS would otherwise start its own thread pool inside our parallel
// regions and oversubscribe the cores.
void pin_blas_to_one_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta,
          float* C, int ldc) {
  pin_blas_to_one_thread();
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

bool gemm_uses_blas() { return true; }

#else

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta,
          float* C, int ldc) {
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      float sum = 0.0f;
      for (int k = 0; k < K; k++) {
        const float a = trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
        const float b = trans_b ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
        sum += a * b;
      }
      float* c = &C[(size_t)i * ldc + j];
      *c = alpha * sum + (beta == 0.0f ? 0.0f : beta * *c);
    }
  }
}

bool gemm_uses_blas() { return false; }

#endif

}  // namespace diloco
