#include "kernels/grad_clip.h"

#include <cmath>
#include <vector>

namespace diloco {

namespace {
constexpr size_t kChunk = 1 << 14;
}

double global_norm(const float* x, size_t n) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; c++) {
    const size_t end = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
    for (size_t i = c * kChunk; i < end; i++) s += (double)x[i] * x[i];
    partial[c] = s;
  }
  double sum = 0.0;
  for (double p : partial) sum += p;
  return std::sqrt(sum);
}

float clip_scale(double norm, double max_norm) {
  // torch adds 1e-6 to the norm here; so do we, for parity.
  if (max_norm > 0.0 && norm > max_norm) return (float)(max_norm / (norm + 1e-6));
  return 1.0f;
}

}  // namespace diloco
