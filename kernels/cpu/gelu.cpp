#include "kernels/gelu.h"

#include "kernels/cpu/fast_math.h"

namespace diloco {

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
}

template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
  const F s = F(kGeluScale);
#pragma omp parallel for simd
  for (size_t i = 0; i < n; i++) {
    const F x = inp[i];
    out[i] = F(0.5) * x * (F(1) + tanh_op(s * (x + F(0.044715) * x * x * x)));
  }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n) {
  const F s = F(kGeluScale);
#pragma omp parallel for simd
  for (size_t i = 0; i < n; i++) {
    const F x = inp[i];
    const F u = s * (x + F(0.044715) * x * x * x);
    const F th = tanh_op(u);
    const F sech2 = F(1) - th * th;
    const F local = F(0.5) * (F(1) + th) +
                    F(0.5) * x * sech2 * s * (F(1) + F(3 * 0.044715) * x * x);
    dinp[i] = local * dout[i];
  }
}

template void gelu_forward<float>(float*, const float*, size_t);
template void gelu_forward<double>(double*, const double*, size_t);
template void gelu_backward<float>(float*, const float*, const float*, size_t);
template void gelu_backward<double>(double*, const double*, const double*, size_t);

}  // namespace diloco
