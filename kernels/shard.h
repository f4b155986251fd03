// How a learner's ring shards its state (train.shard; DESIGN.md "A learner as large as a site"):
//   none       every rank keeps the whole state (gradients all-reduced, AdamW everywhere).
//   optimizer  ZeRO-1: gradients reduce-scattered, each rank keeps the AdamW moments (and on a
//              GPU the fp32 master) of its shard, updates it, parameters all-gathered.
//   gradients  ZeRO-2: as optimizer, and the gradients are reduce-scattered bucket by bucket as
//              the backward finishes them, so a rank holds its shard of them plus the buckets open.
//
// The partition rule (the only one: the backends, the tests and dilococtl plan call these):
// every rank's shard has the same length, ShardPadded(n, world) = ceil(n / world) rounded up to
// whole kShardAlign chunks, and rank r's shard is [r · padded, (r + 1) · padded) of a padded
// buffer of world · padded floats: the n values of the table, then zeros. So the collectives of
// a sharded step move equal parts (one ncclReduceScatter / ncclAllGather, not a grouped
// Reduce / Broadcast per rank). The pads are never parameters: they sit past the table's end,
// the optimizer updates only the real values (ShardCounts), and they stay zero (every rank
// reduces and gathers zeros there). A shard's edges fall on multiples of kShardAlign, which is
// the chunk of global_norm (kernels/grad_clip.h), so the ranks' partial norms add up to the bits
// of the unsharded norm.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <vector>

namespace diloco {

enum class ShardMode { kNone, kOptimizer, kGradients };
inline constexpr std::array<std::string_view, 3> kShardModeNames = {"none", "optimizer", "gradients"};

constexpr size_t kShardAlign = size_t{1} << 14;

// The length of every rank's shard in a padded buffer: ceil(n / world) rounded up to a multiple
// of kShardAlign (0 when n is 0).
size_t ShardPadded(size_t n, int world);
// world x ShardPadded(n, world): the floats of a padded buffer (>= n).
size_t ShardPaddedFloats(size_t n, int world);
// world entries of ShardPadded(n, world): the parts of a padded buffer's collectives.
std::vector<size_t> ShardPaddedCounts(size_t n, int world);
// The real values (not pads) each rank owns: ShardPadded each, in rank order, the last ranks'
// cut at n (so a rank may own fewer, or none when n is small). They sum to n, and rank r's
// values start at PartOffset(ShardCounts(n, world), r), which is r x ShardPadded wherever the
// rank owns any.
std::vector<size_t> ShardCounts(size_t n, int world);

}  // namespace diloco
