// How a learner's ring shards its state (train.shard; DESIGN.md "A learner as large as a site"):
//   none       every rank keeps the whole state (gradients all-reduced, AdamW everywhere).
//   optimizer  ZeRO-1: gradients reduce-scattered, each rank keeps the AdamW moments (and on a
//              GPU the fp32 master) of its shard, updates it, parameters all-gathered.
//   gradients  ZeRO-2: as optimizer, and the gradients are reduce-scattered bucket by bucket as
//              the backward finishes them, so a rank holds its shard of them plus one bucket.
// A shard is one contiguous range of the flat parameter buffer; its edges fall on multiples of
// kShardAlign, which is the chunk of global_norm (kernels/grad_clip.h), so the ranks' partial
// norms add up to the bits of the unsharded norm.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <vector>

namespace diloco {

enum class ShardMode { kNone, kOptimizer, kGradients };
inline constexpr std::array<std::string_view, 3> kShardModeNames = {"none", "optimizer", "gradients"};

constexpr size_t kShardAlign = size_t{1} << 14;

// The values each of `world` ranks owns of n: contiguous, in rank order, every edge but the last
// a multiple of kShardAlign, as even as that allows (a rank may own none when n is small).
std::vector<size_t> ShardCounts(size_t n, int world);

}  // namespace diloco
