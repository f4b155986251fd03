// Synthetic N(0, scale²) floats for the benchmarks (splitmix64 + Box-Muller): deterministic per
// seed, and 64 MiB of them in a fraction of a second.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace diloco {

inline std::vector<float> GaussianData(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<float> x(n);
  uint64_t s = seed;
  auto next = [&s] {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (size_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
    const double r = scale * std::sqrt(-2.0 * std::log(u1));
    x[i] = static_cast<float>(r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) x[i + 1] = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
  }
  return x;
}

}  // namespace diloco
