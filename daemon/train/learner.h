// One learner of a multi-learner run (DESIGN.md §3): inner AdamW steps on its own Gpt and data
// shard; per fragment it counts c_steps/c_tokens since it last folded the fragment; when the
// fragment's cadence fires (fragments.h: Fires) and no delta for it is in flight it publishes
// Δ = base_p − θ_p (with error feedback, codec sync.codec.up) and keeps θ_p at send; on a Global
// newer than base_p it applies the decoded update to its copy of Θ_p, verifies the CRC32C and
// folds per sync.fold. Heartbeats on a timer. learners[i].slowdown stretches each step by sleeping
// (slowdown − 1) × the measured step time.
// Blocking: decoupled never waits; diloco waits for the Global of its delta right after sending;
// streaming waits once a fragment has been in flight for sync.overlap steps.
// Not yet: snapshot resync — a fragment whose Global stream has a gap or a CRC mismatch stops
// syncing (counted in LearnerResult::lost_fragments) instead of requesting a snapshot.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/net/context.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/status.h"

namespace diloco::net {
class Link;
}

namespace diloco {

struct LearnerOptions {
  int index = 0;
  const RunConfig* config = nullptr;
  std::string job_id = "local";
  std::string uplink_endpoint;    // the syncer's SUB
  std::string downlink_endpoint;  // the syncer's PUB
  std::shared_ptr<net::Link> link;  // emulated WAN between this learner and the syncer; may be null
  const float* init_params = nullptr;  // the shared initial model (version 0 of every fragment)
  int threads = 1;                     // OpenMP threads of this learner
  int heartbeat_interval_ms = 200;
  // metrics.jsonl lines ("learner": index), shared by all learners; may be null.
  JsonlWriter* metrics = nullptr;
  std::mutex* metrics_mu = nullptr;
  // Set from outside to stop this learner before train.steps (as if its site failed: it sends
  // no more messages, not even a last heartbeat).
  const std::atomic<bool>* crash = nullptr;
  long crash_after_steps = -1;  // the same after this many steps (-1: never); for tests
};

struct LearnerResult {
  long steps = 0;
  long tokens = 0;
  double train_s = 0;
  double final_train_loss = 0;  // mean of the last log_every steps
  uint64_t bytes_up = 0;        // wire bytes sent (deltas + heartbeats)
  uint64_t bytes_down = 0;      // wire bytes of Globals received
  uint64_t deltas_sent = 0;
  uint64_t globals_applied = 0;
  uint64_t lost_fragments = 0;  // gap or CRC mismatch (needs a snapshot: not implemented)
  double wait_s = 0;            // blocked at outer steps (lock-step modes)
  bool crashed = false;
};

Status RunLearner(net::NetContext& context, const LearnerOptions& options, LearnerResult* result);

}  // namespace diloco
