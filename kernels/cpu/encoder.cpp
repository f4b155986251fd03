#include "kernels/encoder.h"

#include "kernels/cpu/parallel.h"

namespace diloco {

template <typename F>
void encoder_forward(F* out, const int* tokens, const F* wte, const F* wpe,
                     int B, int T, int C) {
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      F* o = out + ((size_t)b * T + t) * C;
      const F* we = wte + (size_t)tokens[b * T + t] * C;
      const F* pe = wpe + (size_t)t * C;
      for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
  }
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int* tokens,
                      int B, int T, int C) {
  ParallelForChunks(C, [&](int c0, int c1) {
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const F* d = dout + ((size_t)b * T + t) * C;
        F* dwe = dwte + (size_t)tokens[b * T + t] * C;
        F* dpe = dwpe + (size_t)t * C;
        for (int c = c0; c < c1; c++) {
          dwe[c] += d[c];
          dpe[c] += d[c];
        }
      }
    }
  });
}

template void encoder_forward<float>(float*, const int*, const float*, const float*, int, int, int);
template void encoder_forward<double>(double*, const int*, const double*, const double*, int, int, int);
template void encoder_backward<float>(float*, float*, const float*, const int*, int, int, int);
template void encoder_backward<double>(double*, double*, const double*, const int*, int, int, int);

}  // namespace diloco
