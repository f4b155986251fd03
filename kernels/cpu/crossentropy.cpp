#include "kernels/crossentropy.h"

#include <cmath>

#include "kernels/cpu/fast_math.h"

namespace diloco {

template <typename F>
void softmax_crossentropy_forward(F* losses, F* probs, const F* logits,
                                  const int* targets, int N, int V) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const F* x = logits + (size_t)n * V;
    F* p = probs + (size_t)n * V;
    F maxv = x[0];
    for (int v = 1; v < V; v++) maxv = x[v] > maxv ? x[v] : maxv;
    const F target_logit = x[targets[n]];  // read before p overwrites x
    F sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) {
      p[v] = exp_op(x[v] - maxv);
      sum += p[v];
    }
    const F inv = F(1) / sum;
    for (int v = 0; v < V; v++) p[v] *= inv;
    // log-sum-exp form: accurate even when the target's probability is tiny.
    losses[n] = std::log(sum) + maxv - target_logit;
  }
}

template <typename F>
void softmax_crossentropy_backward(F* dlogits, const F* probs,
                                   const int* targets, F dloss, int N, int V) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const F* p = probs + (size_t)n * V;
    F* d = dlogits + (size_t)n * V;
    for (int v = 0; v < V; v++) d[v] = p[v] * dloss;
    d[targets[n]] -= dloss;
  }
}

template void softmax_crossentropy_forward<float>(float*, float*, const float*, const int*, int, int);
template void softmax_crossentropy_forward<double>(double*, double*, const double*, const int*, int, int);
template void softmax_crossentropy_backward<float>(float*, const float*, const int*, float, int, int);
template void softmax_crossentropy_backward<double>(double*, const double*, const int*, double, int, int);

}  // namespace diloco
