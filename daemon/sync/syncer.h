// The syncer loop (DESIGN.md §3): per-fragment rounds over the real transport.
//
// It binds a SUB socket (uplink: learners' Delta and Heartbeat) and a PUB socket (downlink:
// Global), holds the GlobalState (Θ_p, u_p, v_p per fragment), and per fragment:
//   - takes each Delta in encoded (HoldPayload, held_delta.h: its payload checked and its norms
//     measured a chunk at a time, never a decoded copy per learner), rejects it through a
//     per-fragment NormFilter (NaN/Inf, norm > k × median) and the staleness check (base more
//     than max_staleness versions old, or from the future);
//   - asks Decide(now, round, options) whether to close the round (quorum K, every live learner
//     in, adaptive grace window; lock-step modes wait for every live learner);
//   - merges (FragmentMerger, merger.h, on sync.merge_threads threads, the same bits for any
//     count): ContributionWeights → MergeDeltas (RDA / mean; embeddings always mean; each held
//     delta decoded chunk by chunk in learner order) → OuterNesterovUpdate → encodes the update
//     with the downlink codec (which decodes it once, for its error feedback) and applies exactly
//     that decoded update to its own Θ_p, so every learner reconstructs the same bits →
//     publishes Global{fragment, version, update payload, CRC32C of Θ_p, contributors};
//   - appends the merge to events.log and checkpoints the GlobalState every N merges.
// The bookkeeping (who is live, pending deltas, the drop and replace rules, Decide's input) is
// the RoundBook (round_book.h). A learner that stops heart-beating drops out of the quorum
// (Decide's liveness); its heartbeats come on two streams (protocol.h), so a long step does not
// silence it. A learner that says it is stopping or has finished (Heartbeat state kStopping /
// kFinished) is no longer waited for; a restarted learner (new incarnation) is waited for again
// once it speaks.
//
// Nothing is lost silently: every SyncerStatus carries, per learner, the highest seq heard on
// its main stream and the deltas held pending (LearnerAck), so a learner finds a delta that
// never arrived (or was dropped with a lost notice, or died with a killed syncer) and sends it
// again; a gap in a learner's main stream makes the next status go out at once. A learner that
// missed a Global sees the version in the status and resyncs.
//
// Durability (update_log.h, state_writer.h): each update is appended to run_dir/updates.log and
// made durable before its Global is published, so a syncer killed with -9 comes back at exactly
// its last published versions (global_state.bin + the log replayed) and never issues a version
// twice. Checkpoints are written by a thread of their own from a copy of the state (the copy,
// O(parameters), is the only part on the merge path); each one lets the log drop what it covers.
// The Nesterov momentum comes back from the checkpoint (it is not in the log), and the downlink
// error-feedback residual starts again at zero.
//
// Joining (the ZeroMQ guide's Clone pattern): the syncer also binds a ROUTER (snapshot_endpoint).
//   - Hello -> Welcome: the learner's tensor table digest, parameter count and fragment layout
//     must match the syncer's (else a Welcome refusing it with the reason: kTableMismatch /
//     kLayoutMismatch); an accepted Welcome is only sent once the syncer has heard that learner
//     incarnation on the uplink (until then kBusy: "try again"), and each accepted Welcome is
//     followed by a SyncerStatus on the downlink, so a learner that holds a Welcome and has seen a
//     downlink message knows both PUB/SUB directions are up (no delta published into the void).
//   - SnapshotRequest -> one Snapshot part per requested fragment (all when none named): full fp32
//     Θ_p, its version and CRC32C, and every fragment's version (the cut after which Globals apply).
// SyncerStatus also goes out every status_interval_ms.
//
// Shards (sync.syncers > 1, shards.h): each shard is a Syncer of its own (options.shard) on its
// own endpoints, merging its fragments only; its checkpoint and update log live in
// run_dir/<shard name>/, its merges go to the run's events.log with the others'.
//
// The decisions above are SyncerCore's (syncer_core.h), a sans-IO core a virtual runtime drives
// too; Syncer is its wall-clock runtime: the sockets, the poll loop, the files.
//
// Threading: Create on any thread, then Run on one thread; RequestStop from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config/sync_config.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/event_log.h"
#include "daemon/net/context.h"
#include "daemon/net/envelope.h"
#include "daemon/net/socket.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/sync/protocol.h"
#include "daemon/sync/shards.h"
#include "daemon/sync/syncer_endpoints.h"
#include "daemon/util/status.h"
#include "kernels/tensor_table.h"

namespace diloco {

struct SyncerOptions {
  SyncConfig sync;
  // Which of the sync.syncers shards this syncer is (shards.h): it merges only that shard's
  // fragments and signs as that shard's name.
  int shard = 0;
  std::string job_id = "local";
  // Its endpoints, all bound by it: inproc:// in local mode, tcp:// between daemons (an empty
  // snapshot endpoint: no ROUTER).
  SyncerEndpoints endpoints;
  // The run directory ("" = none): events.log goes here, global_state.bin and the update log too
  // with one shard, else into the shard's own directory in it (ShardStoreOptions).
  std::string run_dir;
  // Socket security, applied to every socket the syncer creates (socket.h): plaintext is only
  // ever allowed on inproc, ipc and loopback tcp; CURVE (curve.server = true: the syncer's key
  // pair, clients checked against the context's ZAP allowlist) for anything else.
  bool allow_plaintext = true;
  std::optional<net::CurveOptions> curve;
  // With CURVE: learner i's messages must come from the key learner_keys[i] (the site the job
  // placed it on); others are dropped and counted as impostors. Empty: names are not bound to
  // keys (local mode, plaintext).
  std::vector<std::string> learner_keys;
  // With shards in a dilocod job and CURVE: the home shard's site key, which its request for this
  // shard's final fragments must come with (ServeHome). Empty: not checked.
  std::string home_key;
  // A shard other than the home (shard 0) of a dilocod job: after its end (merged, saved) it
  // answers the home's request for its fragments (the home evaluates the joined model) and
  // leaves once it has, or after this long. 0: leaves at once.
  int serve_home_ms = 0;
  // Restore Θ, u, versions, counters and the ledger from run_dir/global_state.bin (must exist
  // and fit this model and fragment layout); versions continue from there, never go back.
  bool resume = false;
  int idle_exit_ms = 1000;  // after RequestStop: leave once the uplink is quiet this long
  // Leave Run() by itself once every learner said kFinished (local mode). A daemon sets false
  // and calls RequestStop.
  bool exit_when_all_finished = true;
  int status_interval_ms = 1000;      // SyncerStatus on the downlink (0: only after Welcomes)
  int heartbeat_interval_ms = 200;    // told to learners in Welcome
  // What a delta's counts are checked against (decide.h CheckCounts): train.steps and the tokens
  // of one learner step (ranks × batch_size × block_size). 0: not checked.
  CountLimits count_limits;
  // Test hook: when it returns true for (fragment, version), that Global goes out with a wrong
  // CRC32C (learners must resync from a snapshot). May be empty.
  std::function<bool(uint32_t fragment, uint64_t version)> corrupt_global_crc;
  // Test hook: when it returns true for (fragment, version), that Global's update goes out with
  // a NaN in it (the syncer's own Θ takes the real one; fp32 downlink only).
  std::function<bool(uint32_t fragment, uint64_t version)> nan_global_update;
  // Test hook: when it returns true for a delta (learner, fragment), the syncer rejects it as if
  // it had failed its checks ("test_rejected"). May be empty.
  std::function<bool(int learner, uint32_t fragment)> reject_delta;
  // Each merge, as it is appended to events.log (a MergeTape's Listener keeps the run's merges
  // for its accounts, so nobody reads the log back). On the syncer's thread; may be empty.
  std::function<void(const MergeEvent&)> on_merge;
};

// options.shard names one of options.sync.syncers shards; the error says what to fix.
Status CheckShard(const SyncerOptions& options);

// One learner as the syncer sees it (CurrentStatus).
struct LearnerStatusEntry {
  int learner = 0;
  bool heard = false;  // any message since the syncer started
  LearnerState state = LearnerState::kJoining;  // from its last heartbeat
  uint64_t incarnation = 0;
  uint64_t step = 0, tokens = 0;
  float loss = 0, tokens_per_s = 0, step_time_ms = 0;
  int64_t last_heard_unix_ms = 0;
  bool live = false;  // heard within sync.heartbeat_timeout_ms and not stopping/finished
  LedgerEntry ledger;  // merged / dropped / rejected deltas and their tokens
};

// A copy of the syncer's state, safe to take from any thread while Run() runs.
struct SyncerStatusSnapshot {
  bool running = false;
  // When Run() took this copy (it refreshes it about every 50 ms): "live" is as of then.
  std::chrono::steady_clock::time_point taken{};
  std::vector<uint64_t> versions;
  uint64_t merges = 0, dropped_deltas = 0, rejected_deltas = 0;
  uint64_t snapshots_served = 0, welcomes = 0, refusals = 0;
  uint64_t impostors = 0;  // messages naming a learner, sent with another key (learner_keys)
  uint64_t bytes_received = 0, bytes_published = 0;
  std::vector<LearnerStatusEntry> learners;  // index = learner
};

struct SyncerResult {
  uint64_t merges = 0;
  uint64_t dropped_deltas = 0;   // too stale / from the future / replaced
  uint64_t rejected_deltas = 0;  // failed the norm filter or the payload check
  uint64_t bytes_received = 0;   // uplink wire bytes (deltas and heartbeats)
  uint64_t bytes_published = 0;  // downlink wire bytes, once per message
  uint64_t snapshots_served = 0;  // snapshot requests answered
  std::vector<uint64_t> versions;
};

class Syncer {
 public:
  // Partitions table into EffectiveFragments(sync) fragments, starts every fragment at
  // version 0 from init_params (or restores run_dir/global_state.bin when options.resume; then
  // init_params may be null), binds the three sockets, opens events.log (appending).
  static Status Create(net::NetContext& context, const SyncerOptions& options,
                       const TensorTable& table, const float* init_params,
                       std::unique_ptr<Syncer>* out);
  ~Syncer();

  // Runs rounds until every learner has finished (or RequestStop and a quiet uplink), then
  // merges whatever is pending and saves the global state.
  Status Run();
  void RequestStop() { stop_ = true; }
  // Leaves Run() at once, merging nothing more and saving nothing (as a kill -9 would; only the
  // update log and the last checkpoint remain). For chaos tests in local mode.
  void Abort() { abort_ = true; }
  // Thread-safe: versions, counters and what each learner last reported.
  SyncerStatusSnapshot CurrentStatus() const;

  const std::vector<Fragment>& fragments() const { return fragments_; }
  const ShardMap& shards() const;                       // which shard merges which fragment
  const std::vector<uint32_t>& owned_fragments() const;  // the fragments this shard merges
  // After Run: Θ of this shard's fragments (every fragment with one syncer) scattered into a flat
  // parameter buffer; the other shards fill in theirs.
  void GlobalParams(float* flat) const;
  const GlobalState& state() const { return state_; }
  const std::string& state_path() const;  // its global_state.bin ("" without a run directory)
  const SyncerResult& result() const { return result_; }

 private:
  struct Impl;
  Syncer() = default;
  void RefreshStatus(bool running);  // status_ from the core's state (Run's thread)
  std::unique_ptr<Impl> impl_;
  std::vector<Fragment> fragments_;
  GlobalState state_;
  SyncerResult result_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> abort_{false};
  mutable std::mutex status_mu_;
  SyncerStatusSnapshot status_;  // guarded by status_mu_, refreshed by Run()
};

}  // namespace diloco
