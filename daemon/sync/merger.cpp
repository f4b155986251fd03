#include "daemon/sync/merger.h"

#include <algorithm>
#include <cmath>

#include "daemon/sync/held_delta.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/protocol.h"
#include "daemon/util/crc32c.h"

namespace diloco {

FragmentMerger::FragmentMerger(const SyncConfig& sync)
    : sync_(sync),
      down_codec_{sync.codec.down, sync.codec.block, 0},
      pool_(std::max(1, sync.merge_threads)),
      down_ef_(down_codec_) {}

Status FragmentMerger::Merge(const Fragment& fragment, uint32_t fragment_index,
                             const std::vector<PendingDelta>& pending, FragmentGlobal* fg, MergeOutcome* out) {
  if (pending.empty()) return Status::Error("nothing to merge");
  const size_t n = fragment.numel;
  if (fg->theta.size() != n || fg->momentum.size() != n)
    return Status::Error("fragment " + std::to_string(fragment_index) + " state does not fit its layout");
  std::vector<HeldDeltaReader> readers;
  readers.reserve(pending.size());
  std::vector<Contribution> contributions;
  for (const PendingDelta& pd : pending) {
    readers.emplace_back(fragment, pd.held);
    contributions.push_back({pd.learner, pd.counts, nullptr, &readers.back()});
  }
  if (merged_.size() < n) merged_.resize(n);
  float* merged = merged_.data();
  DL_RETURN_IF_ERROR(MergeContributions(fragment, &contributions, sync_.weighting, sync_.merge, merged,
                                        &out->weights, &pool_));

  // |merged| per chunk, then u and the update (in place of the merged delta).
  const size_t chunks = (n + kMergeChunk - 1) / kMergeChunk;
  std::vector<double> partial(chunks, 0.0);
  RunTasks(&pool_, chunks, [&](size_t c, int) {
    const size_t b = c * kMergeChunk, m = std::min(kMergeChunk, n - b);
    partial[c] = SumSquares(merged + b, m);
    OuterNesterovUpdate(merged + b, m, sync_.outer.lr, sync_.outer.momentum, fg->momentum.data() + b, merged + b);
  });
  double sq = 0;
  for (double p : partial) sq += p;
  out->delta_norm = std::sqrt(sq);

  const std::vector<uint64_t> numels = FragmentNumels(fragment);
  DL_RETURN_IF_ERROR(down_ef_.Encode(fragment_index, std::span<const float>(merged, n), numels, &out->payload,
                                     &out->tensor_bytes, &pool_)
                         .WithContext("syncer: encoding the update of fragment " + std::to_string(fragment_index)));
  const std::span<const float> decoded = down_ef_.decoded();

  // Θ += decoded update; |update| and the CRC32C of Θ per chunk, joined in order.
  std::vector<uint32_t> crcs(chunks, 0);
  RunTasks(&pool_, chunks, [&](size_t c, int) {
    const size_t b = c * kMergeChunk, m = std::min(kMergeChunk, n - b);
    partial[c] = SumSquares(decoded.data() + b, m);
    ApplyUpdate(decoded.data() + b, m, fg->theta.data() + b);
    crcs[c] = Crc32c(fg->theta.data() + b, m * sizeof(float));
  });
  sq = 0;
  uint32_t crc = 0;
  for (size_t c = 0; c < chunks; c++) {
    sq += partial[c];
    const size_t m = std::min(kMergeChunk, n - c * kMergeChunk);
    crc = c == 0 ? crcs[0] : Crc32cCombine(crc, crcs[c], m * sizeof(float));
  }
  out->update_norm = std::sqrt(sq);
  out->theta_crc32c = n == 0 ? Crc32c(nullptr, 0) : crc;
  return Status::Ok();
}

}  // namespace diloco
