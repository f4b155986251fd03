#include "kernels/shard.h"

#include <algorithm>

#include "kernels/check.h"

namespace diloco {

size_t ShardPadded(size_t n, int world) {
  DL_CHECK(world >= 1, "a ring of %d ranks", world);
  // ceil(ceil(n / world) / kShardAlign) = ceil(n / (world · kShardAlign)): whole chunks per rank.
  const size_t chunks = (n + kShardAlign - 1) / kShardAlign;
  return (chunks + world - 1) / world * kShardAlign;
}

size_t ShardPaddedFloats(size_t n, int world) { return (size_t)world * ShardPadded(n, world); }

std::vector<size_t> ShardPaddedCounts(size_t n, int world) {
  return std::vector<size_t>(world, ShardPadded(n, world));
}

std::vector<size_t> ShardCounts(size_t n, int world) {
  const size_t padded = ShardPadded(n, world);
  std::vector<size_t> counts(world, 0);
  for (int r = 0; r < world; r++) {
    const size_t lo = std::min(n, (size_t)r * padded);
    counts[r] = std::min(n, lo + padded) - lo;
  }
  return counts;
}

}  // namespace diloco
