// The syncer loop (DESIGN.md §3): per-fragment rounds over the real transport.
//
// It binds a SUB socket (uplink: learners' Delta and Heartbeat) and a PUB socket (downlink:
// Global), holds the GlobalState (Θ_p, u_p, v_p per fragment), and per fragment:
//   - decodes each Delta, rejects it through a per-fragment NormFilter (NaN/Inf, norm > k × median)
//     and the staleness check (base more than max_staleness versions old, or from the future);
//   - asks Decide(now, round, options) whether to close the round (quorum K, every live learner
//     in, adaptive grace window; lock-step modes wait for every live learner);
//   - merges: ContributionWeights → MergeDeltas (RDA / mean; embeddings always mean) →
//     OuterNesterovUpdate → encodes the update with the downlink codec, decodes it and applies
//     exactly the decoded update to its own Θ_p, so every learner reconstructs the same bits →
//     publishes Global{fragment, version, update payload, CRC32C of Θ_p, contributors};
//   - appends the merge to events.log and checkpoints the GlobalState every N merges.
// A learner that stops heart-beating drops out of the quorum (Decide's liveness). A learner
// that says it has finished (Heartbeat state kFinished) is no longer waited for.
// Not here yet: snapshots for joining learners (a learner starts from the shared initial
// model), restoring the global state at start, SyncerStatus messages.
//
// Threading: Create on any thread, then Run on one thread; RequestStop from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config/sync_config.h"
#include "daemon/net/context.h"
#include "daemon/net/envelope.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/util/status.h"
#include "kernels/tensor_table.h"

namespace diloco {

// ---- What learner and syncer agree on (local mode) ----

inline std::string LearnerName(int index) { return "learner-" + std::to_string(index); }
inline constexpr const char* kSyncerName = "syncer";

// Element counts of the fragment's ranges, in order (one payload tensor per range).
std::vector<uint64_t> FragmentNumels(const Fragment& fragment);
// The PayloadInfo describing a fragment encoded with EncodeTensors (tensor_bytes from it).
PayloadInfo FragmentPayloadInfo(const Fragment& fragment, CodecKind codec, int block_size,
                                const std::vector<uint64_t>& tensor_bytes);
// Decodes a payload that must describe exactly the fragment's ranges into out (fragment.numel).
Status DecodeFragmentPayload(const Fragment& fragment, const PayloadInfo& info,
                             const ParsedMessage& message, std::vector<float>* out);

struct SyncerOptions {
  SyncConfig sync;
  std::string job_id = "local";
  std::string uplink_endpoint;    // bound: learners' PUB connect here
  std::string downlink_endpoint;  // bound: learners' SUB connect here
  std::string run_dir;            // events.log and global_state.bin go here ("" = none)
  bool allow_plaintext = true;    // local mode (inproc / loopback)
  int idle_exit_ms = 1000;        // after RequestStop: leave once the uplink is quiet this long
};

struct SyncerResult {
  uint64_t merges = 0;
  uint64_t dropped_deltas = 0;   // too stale / from the future / replaced
  uint64_t rejected_deltas = 0;  // failed the norm filter or the payload check
  uint64_t bytes_received = 0;   // uplink wire bytes (deltas and heartbeats)
  uint64_t bytes_published = 0;  // downlink wire bytes, once per message
  std::vector<uint64_t> versions;
};

class Syncer {
 public:
  // Partitions table into EffectiveFragments(sync) fragments, starts every fragment at
  // version 0 from init_params, binds both sockets, opens events.log.
  static Status Create(net::NetContext& context, const SyncerOptions& options,
                       const TensorTable& table, const float* init_params,
                       std::unique_ptr<Syncer>* out);
  ~Syncer();

  // Runs rounds until every learner has finished (or RequestStop and a quiet uplink), then
  // merges whatever is pending and saves the global state.
  Status Run();
  void RequestStop() { stop_ = true; }

  const std::vector<Fragment>& fragments() const { return fragments_; }
  // After Run: Θ of every fragment scattered into a flat parameter buffer.
  void GlobalParams(float* flat) const;
  const GlobalState& state() const { return state_; }
  const SyncerResult& result() const { return result_; }

 private:
  struct Impl;
  Syncer() = default;
  std::unique_ptr<Impl> impl_;
  std::vector<Fragment> fragments_;
  GlobalState state_;
  SyncerResult result_;
  std::atomic<bool> stop_{false};
};

}  // namespace diloco
