#include "kernels/shard.h"

#include <algorithm>

namespace diloco {

std::vector<size_t> ShardCounts(size_t n, int world) {
  std::vector<size_t> counts(world, 0);
  const size_t chunks = (n + kShardAlign - 1) / kShardAlign;
  size_t at = 0;
  for (int r = 0; r < world; r++) {
    // Ranks before `extra` take one chunk more, so no two shards differ by more than one chunk.
    const size_t take = chunks / world + ((size_t)r < chunks % world ? 1 : 0);
    const size_t end = std::min(n, at + take * kShardAlign);
    counts[r] = end - at;
    at = end;
  }
  return counts;
}

}  // namespace diloco
