// Shared helpers for kernel tests: random tensors, central finite
// differences in double, and closeness checks that name the first mismatch.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/rng.h"

namespace diloco::testing {

template <typename F = double>
std::vector<F> random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<F> v(n);
  for (auto& x : v) x = (F)(rng.normal() * scale);
  return v;
}

template <typename To, typename From>
std::vector<To> cast(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// d loss / d x by central differences, perturbing x in place.
inline std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& loss,
                                        double eps = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double up = loss();
    x[i] = saved - eps;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// With DILOCO_PRINT_MAX_ERROR set, every closeness check prints
// "max-error WHAT: D" (D = max |a - b| / max |b|) for scripts/gpu-check.sh's table.
inline void print_max_error(const std::string& what, double worst, double scale) {
  static const bool on = std::getenv("DILOCO_PRINT_MAX_ERROR") != nullptr;
  if (on) std::printf("max-error %s: %.3g\n", what.c_str(), scale > 0 ? worst / scale : worst);
}

// |a - b| <= atol + rtol * |b| elementwise; reports the first failure.
template <typename A, typename B>
void require_close(const std::vector<A>& a, const std::vector<B>& b, double rtol, double atol,
                   const std::string& what) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); i++) {
    const double x = a[i], y = b[i];
    if (!(std::fabs(x - y) <= atol + rtol * std::fabs(y))) {
      FAIL(what << ": element " << i << " is " << x << ", expected " << y);
    }
    worst = std::max(worst, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  print_max_error(what, worst, scale);
}

// max |a - b| <= rtol * max |b|: for fast paths against a reference, where
// single elements near zero carry the rounding of much larger terms.
// min_scale floors max |b| for references that are (near) zero.
template <typename A, typename B>
void require_close_to_scale(const std::vector<A>& a, const std::vector<B>& b, double rtol,
                            const std::string& what, double min_scale = 0) {
  REQUIRE(a.size() == b.size());
  double scale = min_scale, worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < a.size(); i++) {
    scale = std::max(scale, std::fabs((double)b[i]));
    const double d = std::fabs((double)a[i] - (double)b[i]);
    if (!(d <= worst)) {  // also catches NaN
      worst = d;
      worst_i = i;
    }
  }
  print_max_error(what, worst, scale);
  if (!(worst <= rtol * scale)) {
    FAIL(what << ": element " << worst_i << " is " << a[worst_i] << ", expected " << b[worst_i]
              << " (max |diff| " << worst << " > " << rtol << " * max |expected| " << scale << ")");
  }
}

}  // namespace diloco::testing
