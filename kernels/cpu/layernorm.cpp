#include "kernels/layernorm.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace diloco {

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight,
                       const F* bias, int N, int C) {
  const F eps = F(1e-5);
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const F* x = inp + (size_t)n * C;
    F* o = out + (size_t)n * C;
    F m = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    F var = 0;
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const F s = F(1) / std::sqrt(var + eps);
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout,
                        const F* inp, const F* weight, const F* mean,
                        const F* rstd, int N, int C) {
  // Input gradient: rows are independent.
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const F* x = inp + (size_t)n * C;
    const F* d = dout + (size_t)n * C;
    F* dx = dinp + (size_t)n * C;
    const F m = mean[n], s = rstd[n];
    F dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; c++) {
      const F dnorm = weight[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * s;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; c++) {
      const F norm = (x[c] - m) * s;
      const F dnorm = weight[c] * d[c];
      dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  // Parameter gradients: each thread owns a range of channels.
  ParallelForChunks(C, [&](int c0, int c1) {
    for (int n = 0; n < N; n++) {
      const F* x = inp + (size_t)n * C;
      const F* d = dout + (size_t)n * C;
      const F m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; c++) {
        dbias[c] += d[c];
        dweight[c] += (x[c] - m) * s * d[c];
      }
    }
  });
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int, int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*, const double*, const double*, int, int);

}  // namespace diloco
