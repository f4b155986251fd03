#include "kernels/grad_clip.h"

#include <cmath>
#include <vector>

#include "kernels/shard.h"

namespace diloco {

static_assert(kNormChunk == kShardAlign, "shard edges must fall on norm chunk edges");

void norm_chunk_sums(const float* x, size_t n, double* partial) {
  const size_t chunks = (n + kNormChunk - 1) / kNormChunk;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; c++) {
    const size_t end = std::min(n, (c + 1) * kNormChunk);
    double s = 0.0;
    for (size_t i = c * kNormChunk; i < end; i++) s += (double)x[i] * x[i];
    partial[c] = s;
  }
}

double norm_of_chunk_sums(const double* partial, size_t chunks) {
  double sum = 0.0;
  for (size_t c = 0; c < chunks; c++) sum += partial[c];
  return std::sqrt(sum);
}

double global_norm(const float* x, size_t n) {
  std::vector<double> partial((n + kNormChunk - 1) / kNormChunk, 0.0);
  norm_chunk_sums(x, n, partial.data());
  return norm_of_chunk_sums(partial.data(), partial.size());
}

float clip_scale(double norm, double max_norm) {
  // torch adds 1e-6 to the norm here; so do we, for parity.
  if (max_norm > 0.0 && norm > max_norm) return (float)(max_norm / (norm + 1e-6));
  return 1.0f;
}

}  // namespace diloco
