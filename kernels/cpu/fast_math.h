// exp and tanh for float that the compiler can vectorize (glibc's expf and
// tanhf are scalar calls): Cephes-style range reduction and polynomial,
// within 2 ulp of expf over the float range. The double instantiations of
// the reference kernels keep std::exp / std::tanh.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace diloco {

inline float fast_expf(float x) {
  // Beyond these bounds expf under/overflows; clamping keeps 2^n normal.
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);  // round(x / ln 2)
  float r = x - n * 0.693359375f;                               // x - n ln 2, in two parts
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>(((int32_t)n + 127) << 23);  // 2^n
  return p * scale;
}

// tanh x = 1 - 2 / (e^{2x} + 1); absolute error ~1e-7.
inline float fast_tanhf(float x) { return 1.0f - 2.0f / (fast_expf(2.0f * x) + 1.0f); }

template <typename F>
inline F exp_op(F x) {
  if constexpr (std::is_same_v<F, float>) {
    return fast_expf(x);
  } else {
    return std::exp(x);
  }
}

template <typename F>
inline F tanh_op(F x) {
  if constexpr (std::is_same_v<F, float>) {
    return fast_tanhf(x);
  } else {
    return std::tanh(x);
  }
}

}  // namespace diloco
