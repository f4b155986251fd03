#include "kernels/adamw.h"

#include <cmath>

namespace diloco {

void adamw_update(float* params, float* m, float* v, const float* grads,
                  size_t n, const AdamWHyper& hp, long t) {
  const float c1 = 1.0f - (float)std::pow((double)hp.beta1, (double)t);
  const float c2 = 1.0f - (float)std::pow((double)hp.beta2, (double)t);
#pragma omp parallel for simd
  for (size_t i = 0; i < n; i++) {
    const float g = grads[i] * hp.grad_scale;
    const float mi = hp.beta1 * m[i] + (1.0f - hp.beta1) * g;
    const float vi = hp.beta2 * v[i] + (1.0f - hp.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / c1;
    const float vhat = vi / c2;
    params[i] -= hp.lr * (mhat / (std::sqrt(vhat) + hp.eps) + hp.weight_decay * params[i]);
  }
}

}  // namespace diloco
