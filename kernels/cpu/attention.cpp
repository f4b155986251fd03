#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"

namespace diloco {

template <typename F>
void attention_forward_reference(F* out, F* att, const F* inp, int B, int T,
                                 int C, int NH) {
  const int hs = C / NH;
  const F scale = F(1) / std::sqrt(F(hs));
  const size_t C3 = (size_t)3 * C;
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        const F* q = inp + (b * T + t) * C3 + h * hs;
        F* a = att + (((size_t)b * NH + h) * T + t) * T;
        F maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const F* k = inp + (b * T + t2) * C3 + C + h * hs;
          F dot = 0;
          for (int i = 0; i < hs; i++) dot += q[i] * k[i];
          a[t2] = dot * scale;
          maxv = a[t2] > maxv ? a[t2] : maxv;
        }
        F sum = 0;
        for (int t2 = 0; t2 <= t; t2++) {
          a[t2] = std::exp(a[t2] - maxv);
          sum += a[t2];
        }
        for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] / sum : F(0);
        F* o = out + ((size_t)b * T + t) * C + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0;
        for (int t2 = 0; t2 <= t; t2++) {
          const F* v = inp + (b * T + t2) * C3 + 2 * C + h * hs;
          for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
        }
      }
    }
  }
}

template <typename F>
void attention_backward_reference(F* dinp, const F* dout, const F* inp,
                                  const F* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const F scale = F(1) / std::sqrt(F(hs));
  const size_t C3 = (size_t)3 * C;
  // Parallel over (b, h) only: dk and dv of a head gather from every t.
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      std::vector<F> datt(T);
      for (int t = 0; t < T; t++)
        for (int part = 0; part < 3; part++)
          for (int i = 0; i < hs; i++) dinp[(b * T + t) * C3 + part * C + h * hs + i] = 0;
      for (int t = 0; t < T; t++) {
        const F* a = att + (((size_t)b * NH + h) * T + t) * T;
        const F* d = dout + ((size_t)b * T + t) * C + h * hs;
        const F* q = inp + (b * T + t) * C3 + h * hs;
        F* dq = dinp + (b * T + t) * C3 + h * hs;
        // Through out = att @ v.
        for (int t2 = 0; t2 <= t; t2++) {
          const F* v = inp + (b * T + t2) * C3 + 2 * C + h * hs;
          F* dv = dinp + (b * T + t2) * C3 + 2 * C + h * hs;
          F dot = 0;
          for (int i = 0; i < hs; i++) {
            dot += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
          datt[t2] = dot;
        }
        // Through the softmax, then the scaled dot products.
        F weighted = 0;
        for (int t2 = 0; t2 <= t; t2++) weighted += a[t2] * datt[t2];
        for (int t2 = 0; t2 <= t; t2++) {
          const F dpre = a[t2] * (datt[t2] - weighted) * scale;
          const F* k = inp + (b * T + t2) * C3 + C + h * hs;
          F* dk = dinp + (b * T + t2) * C3 + C + h * hs;
          for (int i = 0; i < hs; i++) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
    }
  }
}

template void attention_forward_reference<float>(float*, float*, const float*, int, int, int, int);
template void attention_forward_reference<double>(double*, double*, const double*, int, int, int, int);
template void attention_backward_reference<float>(float*, const float*, const float*, const float*, int, int, int, int);
template void attention_backward_reference<double>(double*, const double*, const double*, const double*, int, int, int, int);

// Fast path. Per (batch row, head) the scores are one gemm per block of
// query rows; a block only looks at keys up to its last row (causality), so
// the masked upper triangle is mostly skipped.
namespace {
constexpr int kRowBlock = 64;

struct HeadView {
  const float* q;  // (T, hs) with row stride 3C
  const float* k;
  const float* v;
  int ld;  // 3C
};

HeadView head_view(const float* inp, int b, int h, int T, int C, int NH) {
  const int hs = C / NH;
  const float* base = inp + (size_t)b * T * 3 * C + (size_t)h * hs;
  return {base, base + C, base + 2 * C, 3 * C};
}
}  // namespace

void attention_forward(float* out, float* att, const float* inp, int B, int T,
                       int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const HeadView x = head_view(inp, b, h, T, C, NH);
      float* P = att + ((size_t)b * NH + h) * T * T;
      float* Y = out + (size_t)b * T * C + (size_t)h * hs;
      for (int i0 = 0; i0 < T; i0 += kRowBlock) {
        const int i1 = std::min(T, i0 + kRowBlock);
        float* Pb = P + (size_t)i0 * T;
        // scores (i1-i0, i1) = q[i0:i1] k[0:i1]^T * scale
        gemm(false, true, i1 - i0, i1, hs, scale, x.q + (size_t)i0 * x.ld, x.ld,
             x.k, x.ld, 0.0f, Pb, T);
        for (int t = i0; t < i1; t++) {
          float* a = P + (size_t)t * T;
          float maxv = a[0];
          for (int t2 = 1; t2 <= t; t2++) maxv = a[t2] > maxv ? a[t2] : maxv;
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int t2 = 0; t2 <= t; t2++) {
            a[t2] = fast_expf(a[t2] - maxv);
            sum += a[t2];
          }
          const float inv = 1.0f / sum;
          for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
          for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
        }
        // y[i0:i1] = att[i0:i1, 0:i1] v[0:i1]
        gemm(false, false, i1 - i0, hs, i1, 1.0f, Pb, T, x.v, x.ld, 0.0f,
             Y + (size_t)i0 * C, C);
      }
    }
  }
}

void attention_backward(float* dinp, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt((float)hs);
#pragma omp parallel
  {
    // Scratch for the gradient of one block of attention rows.
    std::vector<float> dP((size_t)kRowBlock * T);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        const HeadView x = head_view(inp, b, h, T, C, NH);
        const size_t head_offset = (size_t)b * T * 3 * C + (size_t)h * hs;
        float* dq = dinp + head_offset;
        float* dk = dq + C;
        float* dv = dq + 2 * C;
        const float* P = att + ((size_t)b * NH + h) * T * T;
        const float* dY = dout + (size_t)b * T * C + (size_t)h * hs;
        for (int t = 0; t < T; t++)
          for (int part = 0; part < 3; part++) std::fill_n(dq + (size_t)t * x.ld + part * C, hs, 0.0f);
        for (int i0 = 0; i0 < T; i0 += kRowBlock) {
          const int i1 = std::min(T, i0 + kRowBlock);
          const int rows = i1 - i0;
          const float* Pb = P + (size_t)i0 * T;
          const float* dYb = dY + (size_t)i0 * C;
          // dv[0:i1] += att[i0:i1, 0:i1]^T dy[i0:i1]
          gemm(true, false, i1, hs, rows, 1.0f, Pb, T, dYb, C, 1.0f, dv, x.ld);
          // datt (rows, i1) = dy[i0:i1] v[0:i1]^T
          gemm(false, true, rows, i1, hs, 1.0f, dYb, C, x.v, x.ld, 0.0f,
               dP.data(), T);
          // Softmax backward: dscores = att * (datt - sum(att * datt)).
          for (int r = 0; r < rows; r++) {
            const int t = i0 + r;
            const float* a = Pb + (size_t)r * T;
            float* d = dP.data() + (size_t)r * T;
            float weighted = 0.0f;
#pragma omp simd reduction(+ : weighted)
            for (int t2 = 0; t2 <= t; t2++) weighted += a[t2] * d[t2];
            for (int t2 = 0; t2 <= t; t2++) d[t2] = a[t2] * (d[t2] - weighted);
            for (int t2 = t + 1; t2 < i1; t2++) d[t2] = 0.0f;
          }
          // dq[i0:i1] += scale * dscores k[0:i1]; dk[0:i1] += scale * dscores^T q[i0:i1]
          gemm(false, false, rows, hs, i1, scale, dP.data(), T, x.k, x.ld, 1.0f,
               dq + (size_t)i0 * x.ld, x.ld);
          gemm(true, false, i1, hs, rows, scale, dP.data(), T,
               x.q + (size_t)i0 * x.ld, x.ld, 1.0f, dk, x.ld);
        }
      }
    }
  }
}

}  // namespace diloco
