#include "kernels/matmul.h"

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace diloco {

template <typename F>
void matmul_forward_reference(F* out, const F* inp, const F* weight,
                              const F* bias, int N, int C, int OC) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      F sum = bias ? bias[o] : F(0);
      for (int c = 0; c < C; c++) sum += inp[(size_t)n * C + c] * weight[(size_t)o * C + c];
      out[(size_t)n * OC + o] = sum;
    }
  }
}

template <typename F>
void matmul_backward_reference(F* dinp, F* dweight, F* dbias, const F* dout,
                               const F* inp, const F* weight, int N, int C,
                               int OC) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) dinp[(size_t)n * C + c] = 0;
    for (int o = 0; o < OC; o++) {
      const F d = dout[(size_t)n * OC + o];
      for (int c = 0; c < C; c++) dinp[(size_t)n * C + c] += weight[(size_t)o * C + c] * d;
    }
  }
#pragma omp parallel for
  for (int o = 0; o < OC; o++) {
    for (int n = 0; n < N; n++) {
      const F d = dout[(size_t)n * OC + o];
      if (dbias) dbias[o] += d;
      for (int c = 0; c < C; c++) dweight[(size_t)o * C + c] += inp[(size_t)n * C + c] * d;
    }
  }
}

template void matmul_forward_reference<float>(float*, const float*, const float*, const float*, int, int, int);
template void matmul_forward_reference<double>(double*, const double*, const double*, const double*, int, int, int);
template void matmul_backward_reference<float>(float*, float*, float*, const float*, const float*, const float*, int, int, int);
template void matmul_backward_reference<double>(double*, double*, double*, const double*, const double*, const double*, int, int, int);

void matmul_forward(float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  // Each thread computes a block of output rows.
  ParallelForChunks(N, [&](int n0, int n1) {
    float* o = out + (size_t)n0 * OC;
    if (bias) {
      for (int n = n0; n < n1; n++)
        for (int j = 0; j < OC; j++) out[(size_t)n * OC + j] = bias[j];
    }
    gemm(false, true, n1 - n0, OC, C, 1.0f, inp + (size_t)n0 * C, C, weight, C,
         bias ? 1.0f : 0.0f, o, OC);
  });
}

void matmul_backward(float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight,
                     int N, int C, int OC) {
  // dinp (N,C) = dout (N,OC) @ weight (OC,C): threads own rows of dinp.
  ParallelForChunks(N, [&](int n0, int n1) {
    gemm(false, false, n1 - n0, C, OC, 1.0f, dout + (size_t)n0 * OC, OC, weight,
         C, 0.0f, dinp + (size_t)n0 * C, C);
  });
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C): threads own rows of dweight.
  ParallelForChunks(OC, [&](int o0, int o1) {
    gemm(true, false, o1 - o0, C, N, 1.0f, dout + o0, OC, inp, C, 1.0f,
         dweight + (size_t)o0 * C, C);
    if (dbias) {
      for (int n = 0; n < N; n++)
        for (int o = o0; o < o1; o++) dbias[o] += dout[(size_t)n * OC + o];
    }
  });
}

}  // namespace diloco
