// One merge of a fragment, as the syncer runs it (and `dilococtl bench syncer` measures it):
// the round's held deltas (held_delta.h) in learner order → ContributionWeights → MergeDeltas
// (RDA / mean, each held delta decoded a tile at a time into the sums) → then, one pass per piece
// of the downlink codec (ErrorFeedback::EncodeInPieces) while it is in cache: OuterNesterovUpdate
// → the downlink codec with error feedback (the update decoded once) → Θ += exactly that decoded
// update → CRC32C of Θ.
//
// Threads: a fixed pool of sync.merge_threads (the caller's thread included) works on chunks of
// the fragment's ranges (merge.h kMergeChunk) and on the downlink codec's pieces. Every
// sum has a fixed order whatever the thread count, so the bits of Θ, u and the payload do not
// depend on it. Buffers (the merged delta, the codec's) are kept and reused from merge to merge:
// they grow to the largest fragment once.
//
// sync.age_power scales each delta's weight by its age (versions behind Θ_p), sync.partial: share
// a round of k deltas by k / sync.learners; sync.outer.
// restart_every zeroes u_p before every N-th merge of p; sync.anchor: current adds Θ_current −
// Θ_base to each stale delta, from the last max_staleness versions of Θ_p this merger keeps (in
// memory only: after a restart, deltas based on versions from before it merge as sent).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "daemon/config/sync_config.h"
#include "daemon/net/codec.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/sync/round_book.h"
#include "daemon/util/status.h"
#include "daemon/util/task_pool.h"

namespace diloco {

struct MergeOutcome {
  std::vector<double> weights;         // per merged delta, in learner order
  std::vector<uint8_t> payload;        // the update Θ_new − Θ_old, downlink-encoded
  std::vector<uint64_t> tensor_bytes;  // per range of the fragment
  uint32_t theta_crc32c = 0;           // of Θ after the update
  double delta_norm = 0;               // |merged delta|
  double update_norm = 0;              // |decoded update|
};

class FragmentMerger {
 public:
  // Uses sync.weighting, merge, outer, codec.down / codec.block and merge_threads.
  explicit FragmentMerger(const SyncConfig& sync);

  // Merges pending (fresh deltas of one round, any order: merged in learner order) into fg:
  // u and Θ move; fg->version is the caller's to bump. fragment_index keys the downlink error
  // feedback. On error the fragment's state may have partly moved (u, and Θ where a piece was
  // applied before another failed): the caller must not merge on with it (the syncer stops; its
  // state file holds the last good version). Only a non-finite update fails here.
  Status Merge(const Fragment& fragment, uint32_t fragment_index, const std::vector<PendingDelta>& pending,
               FragmentGlobal* fg, MergeOutcome* out);

  int threads() const { return pool_.threads(); }
  // The merge's threads, for other work of the syncer's thread between merges (HoldPayload).
  TaskPool* pool() { return &pool_; }
  const CodecOptions& down_codec() const { return down_codec_; }

 private:
  SyncConfig sync_;
  CodecOptions down_codec_;
  TaskPool pool_;
  ErrorFeedback down_ef_;
  std::vector<float> merged_;  // the merged delta, then (in place) the update
  // sync.anchor: current: Θ_p at its recent versions, oldest first.
  std::map<uint32_t, std::deque<std::pair<uint64_t, std::vector<float>>>> history_;
};

}  // namespace diloco
