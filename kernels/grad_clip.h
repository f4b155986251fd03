// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_). The
// scale is applied inside the AdamW update (AdamWHyper::grad_scale), which
// saves a pass over the gradients.
#pragma once

#include <cstddef>

namespace diloco {

// L2 norm of x (n), summed in double over fixed-size chunks: the result is
// bitwise the same for any thread count.
double global_norm(const float* x, size_t n);

// The two halves of global_norm, for a buffer sharded over ranks at chunk
// edges (kernels/shard.h): the sum of squares of each kNormChunk-value chunk
// of x (n) into partial (ceil(n / kNormChunk) doubles), and the norm of the
// whole buffer from every chunk's sum, added in chunk order as global_norm does.
constexpr size_t kNormChunk = size_t{1} << 14;
void norm_chunk_sums(const float* x, size_t n, double* partial);
double norm_of_chunk_sums(const double* partial, size_t chunks);

// The factor that brings a gradient of this norm down to max_norm: 1 when
// norm <= max_norm or max_norm <= 0 (clipping off).
float clip_scale(double norm, double max_norm);

}  // namespace diloco
