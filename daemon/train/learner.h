// One learner of a multi-learner run (DESIGN.md §3): a local ring of train.ranks ranks on
// train.device (local_ring.h) running the one inner loop (inner_loop.h) on its data shard, with
// the outer sync as the loop's hook on rank 0. Per fragment it counts c_steps/c_tokens since it
// last folded the fragment; when the fragment's cadence fires (fragments.h: Fires) and no delta
// for it is in flight it publishes Δ = base_p − θ_p (with error feedback, codec sync.codec.up)
// and keeps θ_p at send; on a Global newer than base_p it applies the decoded update to its copy
// of Θ_p, verifies the CRC32C and folds per sync.fold. Delta, codec and fold run where the
// parameters live (the backend's sync_* ops: on a GPU only the encoded payloads cross to the
// host); the host keeps a mirror of each base_p, updated from the same decoded bytes, for the CRC
// check. Heartbeats on a timer. learners[i].slowdown and .jitter stretch each step by
// sleeping (step_stretch.h).
// Blocking: decoupled never waits; diloco waits for the Global of its delta right after sending;
// streaming waits once a fragment has been in flight for sync.overlap steps. A wait lasts as long
// as the syncer speaks (syncer_timeout_ms of silence is an error), not a fixed time.
// Bookkeeping per fragment is the FragmentLedger (fragment_ledger.h). Each SyncerStatus is
// checked against it: a fragment whose version differs from ours missed a Global (resync); an
// in-flight delta the syncer heard past and does not hold is lost and sent again at once. A Global
// whose update does not decode or is not finite is refused (resync). Liveness heartbeats come
// from a thread of their own (liveness_sender.h). At the end the learner flushes: it waits for
// the Globals of its deltas in flight, sends the work left, and waits for that to be merged
// (until flush_timeout_ms pass with no learner stepping), so no trained token is left out of the global model.
//
// Start (every learner): subscribe to the downlink, connect the uplink and the snapshot DEALER
// (of every syncer shard: sync.syncers, shards.h; heartbeats go to all, each fragment's delta to
// its owner), then the startup exchange: Heartbeat(kJoining) on the uplink and Hello on the DEALER until the
// syncer answers Welcome (accepted only once it has heard this learner on the uplink; a layout
// mismatch is a clear error) and a downlink message has arrived. Only then does training start,
// so no delta is published before the PUB/SUB connections are up (a lost first delta used to
// leave lock-step learners waiting forever).
// Snapshots (the Clone pattern, net/clone.h): on start with join_from_snapshot, on a gap in any
// fragment's Global stream and on a CRC mismatch, the learner buffers Globals, sends a
// SnapshotRequest, and installs the reply: for each fragment whose version or bits differ from
// what it holds, θ_p ← Θ_p, base_p ← Θ_p, counters reset, no delta in flight, error-feedback
// residual dropped; then the buffered Globals newer than the snapshot's cut apply. Meanwhile it
// keeps training (decoupled) but sends no deltas; it re-requests if no reply comes in
// snapshot_retry_ms.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/net/context.h"
#include "daemon/net/envelope.h"
#include "daemon/net/socket.h"
#include "daemon/sync/syncer_endpoints.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/status.h"

namespace diloco::net {
class Link;
}

namespace diloco {

struct LearnerProgress;
struct LocalRingOptions;
class LocalRing;

struct LearnerOptions {
  int index = 0;  // this learner's name is LearnerName(index) = "learner-<index>"
  const RunConfig* config = nullptr;
  std::string job_id = "local";
  // Each syncer shard's endpoints (index = shard, shards.h; one with sync.syncers: 1): inproc://
  // in local mode, tcp:// between daemons; all connected, a socket of each kind per shard.
  std::vector<SyncerEndpoints> syncers;
  // Socket security for every socket of the learner (net/socket.h): plaintext only on inproc,
  // ipc and loopback tcp; else CURVE with this learner's key pair and the syncer's public key
  // (curve->server_public_key_z85, or a shard's own curve_server_key; server is forced false).
  bool allow_plaintext = true;
  std::optional<net::CurveOptions> curve;
  std::shared_ptr<net::Link> link;  // emulated WAN between this learner and the syncer; may be null
  // The shared initial model (version 0 of every fragment). May be null when join_from_snapshot.
  const float* init_params = nullptr;
  // Start from the syncer's current global state (a restarted or late learner) instead of
  // init_params: train only after the snapshot is installed.
  bool join_from_snapshot = false;
  // First inner step (a restarted learner continues: data order, LR schedule and train.steps
  // count from here). AdamW moments come from learner-<index>.ckpt in run_dir when there is one
  // (written every train.checkpoint_every steps), else start at zero.
  long start_step = 0;
  // When train.time_limit_s started counting (Unix ms, the port's clock): a restarted incarnation
  // keeps the budget of the first one instead of starting a new one. 0: when this one trains.
  int64_t time_budget_start_unix_ms = 0;
  int threads = 1;  // OpenMP threads of this learner
  // The first device of this learner's ring when not train.device itself (LearnerDevice).
  std::string device;
  int heartbeat_interval_ms = 200;
  int handshake_timeout_ms = 60000;  // no Welcome + downlink message by then: error
  int snapshot_retry_ms = 3000;      // a snapshot request unanswered this long is sent again
  // Waiting for a Global (lock-step modes, the final flush) lasts as long as the syncer speaks;
  // no downlink message for this long is an error.
  int syncer_timeout_ms = 600000;
  int flush_timeout_ms = 60000;  // the end gives up on the last deltas. merges after this long without progress (no other learner stepping)
  // The run directory: the learner keeps learner-<index>.step there (run_dir.h), what a resumed
  // learner continues from. Empty: nothing is written.
  std::string run_dir;
  // Its metrics lines ("learner": index; learner-<i>.jsonl, run_dir.h), under metrics_mu when
  // another incarnation may write too; may be null.
  JsonlWriter* metrics = nullptr;
  std::mutex* metrics_mu = nullptr;
  // Clean stop (a daemon stopping the job): once set, the learner sends its pending work as
  // deltas, a last Heartbeat(kStopping), and returns OK with result.stopped.
  const std::atomic<bool>* stop = nullptr;
  // Set from outside to stop this learner before train.steps (as if its site failed: it sends
  // no more messages, not even a last heartbeat).
  const std::atomic<bool>* crash = nullptr;
  long crash_after_steps = -1;  // the same after this many steps (-1: never); for tests
  // When set, a factor chaos `slow` events change while the learner runs; each step is
  // stretched by the larger of it and learners[index].slowdown.
  const std::atomic<double>* slowdown = nullptr;
  // Called on the learner's thread after every step and on state changes (cheap: copy what
  // you need). May be empty.
  std::function<void(const LearnerProgress&)> on_progress;
  // Makes the learner's ring instead of LocalRing::Create (a ring across a site's hosts:
  // LocalRing::CreateAcrossHosts, with this learner's ranks first). Such a ring's restarted
  // learner starts its AdamW moments at zero on every host (its checkpoint holds only this host's
  // ranks' part). May be empty.
  std::function<Status(const LocalRingOptions&, std::unique_ptr<LocalRing>*)> make_ring;
  // Test hook: called on the learner's thread before every step (may block). May be empty.
  std::function<void(long step)> before_step;
};

// What a learner is doing (LearnerOptions::on_progress).
struct LearnerProgress {
  int index = 0;
  std::string device;  // the local ring: "cpu", "cpu x 2 ranks (threads)", "cuda:0 NVIDIA H200 ..."
  int ranks = 1;
  LearnerState state = LearnerState::kJoining;
  long step = 0;  // inner steps done (counting from 0, start_step included)
  long tokens = 0;  // tokens trained on by this incarnation
  double loss = 0;  // last train loss
  double tokens_per_s = 0;
  int last_fragment_sent = -1;
  int last_fragment_folded = -1;
  std::vector<uint64_t> base_versions;  // per fragment: version of the global it last folded
  uint64_t deltas_sent = 0, globals_applied = 0, snapshots_installed = 0;
};

struct LearnerResult {
  long steps = 0;  // the step reached (start_step included)
  long tokens = 0;  // tokens trained on by this incarnation
  double train_s = 0;
  double final_train_loss = 0;  // mean of the last log_every steps
  uint64_t bytes_up = 0;        // wire bytes sent (deltas, heartbeats, hellos, requests)
  uint64_t bytes_down = 0;      // wire bytes received (globals, status, welcomes, snapshots)
  uint64_t deltas_sent = 0;
  uint64_t globals_applied = 0;
  uint64_t snapshots_installed = 0;
  uint64_t gaps = 0;            // gaps found in the Global stream (each led to a snapshot)
  uint64_t crc_mismatches = 0;  // Globals whose CRC did not match (each led to a snapshot)
  uint64_t deltas_dropped = 0;  // own deltas the syncer said it dropped or rejected
  uint64_t deltas_lost = 0;     // own deltas the syncer never got (found through its acks; sent again)
  uint64_t globals_missed = 0;  // fragments whose Global never arrived (found through SyncerStatus)
  uint64_t globals_refused = 0; // Globals with a non-finite update (each led to a snapshot)
  double wait_s = 0;            // blocked at outer steps (lock-step modes)
  bool crashed = false;
  bool stopped = false;         // stopped cleanly through LearnerOptions::stop
  bool moments_restored = false; // a restart took its AdamW moments from learner-<i>.ckpt
  // For goodput accounting: when this incarnation started training, when it was blocked at an
  // outer step (lock-step modes, [start, end) in Unix ms), and its provisioned time (its steps on
  // the hardware it was given, without a chaos slowdown): NominalTokensPerS (sync/goodput.h).
  int64_t train_start_unix_ms = 0;
  std::vector<std::pair<int64_t, int64_t>> blocked_unix_ms;
  double provisioned_s = 0;
  // Work a fold threw away (sync.fold overwrite, or the Θ share of mix): when, which fragment, how
  // many tokens (goodput's discarded waste).
  struct Discarded {
    int64_t unix_ms = 0;
    int fragment = 0;
    double tokens = 0;
  };
  std::vector<Discarded> discarded;
  // Crashed: per fragment, the tokens trained since its base that had not left in a delta (lost
  // with the learner; an in-flight delta may still be merged).
  std::vector<uint64_t> unsent_tokens_at_crash;
  int64_t crashed_unix_ms = 0;
  int64_t end_unix_ms = 0;  // when this incarnation's training and flush ended
  // With train.ranks > 1: CRC32C of each rank's parameters when the inner loop ended (before the
  // last Globals folded into rank 0); all equal.
  std::vector<uint32_t> rank_param_crc32c;
};

Status RunLearner(net::NetContext& context, const LearnerOptions& options, LearnerResult* result);

}  // namespace diloco
