// The syncer's round book: what it knows of every learner and every fragment's open round.
// Pure bookkeeping under an injected clock (no sockets, no model maths), table-tested like Decide.
//
// Per learner: the incarnation heard last (a new one is a restart: waited for again, its stream
// and forecast start over), when it was last heard (either uplink stream: the training thread's
// or the liveness thread's), the highest seq of its main stream (acks), its last heartbeat (the
// forecast of its next delta and the cross-check of a delta's counts), whether it said it stops.
// Per fragment: the pending deltas (one per learner: a newer one replaces the older), the norm
// filter, and the input to Decide.
//
// Rules a delta passes, in order (each failure is a drop with a reason; see Admit):
//   implausible_counts  CheckCounts, and c_steps no more than its last heartbeat for that base
//                       showed plus the steps since that heartbeat (counts buy weight);
//   already_merged      sent at a step no later than the learner's last merged delta of the
//                       fragment (any incarnation): its steps are in the global model already. A
//                       restarted learner redoes steps after its last saved one, or rejoins a
//                       lock-step fleet at the fleet's step (dilococtl dst --seed 8359: a step
//                       counted twice). Told, so the learner counts its work as merged;
//   too_stale / from_the_future  CheckStaleness against the fragment's version;
//   late                (lock-step modes) a cadence delta whose round was merged without it (a
//                       learner rejoined or cut off meanwhile): told, so the learner stops
//                       waiting for a Global that would come only with the next round, while the
//                       others wait for its next delta (a deadlock: dilococtl dst --seed 40); its
//                       work goes with its next delta of the fragment (one sent at the learner's
//                       last step is never late: the next round takes it; seed 387);
//   non_finite / norm_too_large  the fragment's NormFilter (on the held ranges' norms when known);
//   replaced            an older pending delta of the same learner gives way (not told: the
//                       learner waits for the newer one, which is pending).
// At merge time the staleness is checked again (the fragment may have moved on).
//
// Drops accumulate until the syncer takes them (TakeDrops): it logs them with the fragment's next
// merge, counts them in the ledger and names the told ones in its next SyncerStatus.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/net/envelope.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/drop_reasons.h"
#include "daemon/sync/held_delta.h"
#include "daemon/sync/merge.h"

namespace diloco {

struct RoundBookOptions {
  int learners = 1;
  int fragments = 1;
  int inner_steps = 1;  // H: when a fragment's next delta is due (forecasts)
  int max_staleness = 4;
  int64_t heartbeat_timeout_ms = 3000;
  CountLimits count_limits;  // 0 fields: not checked
  double norm_limit = 0;     // NormFilter max_ratio (0: no norm limit; NaN/Inf are always refused)
  bool lock_step = false;    // diloco, streaming: every live learner's delta of a step in one round
  // The fragments this book's syncer shard merges (shards.h); empty: all. Deltas of the others
  // never reach it, so they say nothing of the fleet's cadence.
  std::vector<uint32_t> owned;
};

// The book's options for a run's sync settings with P fragments (count limits and the norm
// filter as the syncer sets them; the caller may tighten count_limits).
RoundBookOptions RoundBookOptionsFor(const SyncConfig& sync, int fragments);

// A delta as the book checks it (its decoded values) and keeps it (held: held_delta.h).
struct DeltaArrival {
  int learner = 0;
  uint32_t fragment = 0;
  uint64_t base_version = 0;
  uint64_t c_steps = 0, c_tokens = 0;
  uint64_t learner_step = 0;
  std::span<const float> values;  // decoded (the fragment's packed delta): checked, not kept;
                                  // empty: held.values (a delta held as its fp32 values)
  HeldDelta held;                 // what stays pending
};

struct PendingDelta {
  int learner = 0;
  uint64_t base_version = 0;
  ContributionCounts counts;
  uint64_t learner_step = 0;
  HeldDelta held;
  SyncTime at;
};

// A delta that will not be merged.
struct DeltaDrop {
  int learner = 0;
  uint32_t fragment = 0;
  uint64_t base_version = 0;
  std::string why;     // "too_stale", "implausible_counts", "replaced", ...
  std::string detail;  // numbers, for a human
  double tokens = 0;   // its c_tokens (0 when the delta could not be read)
  bool rejected = false;      // failed a check (else: dropped, e.g. too stale or replaced)
  bool tell_learner = true;   // named in the next SyncerStatus
};

class RoundBook {
 public:
  // start: when the syncer started; a learner not heard yet counts as heard then (a lock-step
  // round waits for it through one heartbeat timeout).
  RoundBook(const RoundBookOptions& options, SyncTime start);

  // Any uplink message of learner (index checked by the caller). Returns true when it is a new
  // incarnation: the learner restarted, so everything known of the old one is forgotten.
  bool OnHeard(int learner, uint64_t incarnation, SyncTime now);
  // A message of the learner's main stream (deltas and the training thread's heartbeats) with
  // this seq: the acks report the highest.
  void OnStreamSeq(int learner, uint64_t seq);
  void OnHeartbeat(int learner, const HeartbeatMsg& heartbeat, SyncTime now);
  // A delta of fragment has left the learner: no forecast for it until a heartbeat says otherwise.
  void OnDeltaSeen(int learner, uint32_t fragment);

  // A delta refused before the book's checks (payload does not decode, a test hook).
  void Reject(int learner, uint32_t fragment, uint64_t base_version, const std::string& why,
              const std::string& detail);
  // Checks a decoded delta against the rules above, with current_version the fragment's version.
  // Accepted: pending (returns true). Else a drop is recorded (returns false).
  bool Admit(DeltaArrival&& delta, uint64_t current_version, SyncTime now);

  bool HasPending(uint32_t fragment) const { return !pending_[fragment].empty(); }
  size_t PendingCount(uint32_t fragment) const { return pending_[fragment].size(); }
  const std::vector<PendingDelta>& Pending(uint32_t fragment) const { return pending_[fragment]; }
  // Decide's input for fragment's open round.
  RoundState Round(uint32_t fragment, SyncTime now, const RoundTimings& timings) const;
  // The fragment's pending deltas that are still fresh at current_version, in learner order (a
  // merge must not depend on arrival order); the stale ones become drops. The round is emptied.
  std::vector<PendingDelta> TakeForMerge(uint32_t fragment, uint64_t current_version);
  // A merge of an earlier syncer incarnation (events.log, on resume): learner's delta of fragment
  // sent at learner_step is in the global model. Restores what TakeForMerge remembers of it (the
  // cadence, and the steps merged: dilococtl dst --seed 26, a learner rejoining a restarted
  // syncer's lock-step fleet at step 4 redid 42 steps already merged).
  void RecallMerged(int learner, uint32_t fragment, uint64_t learner_step);
  std::vector<DeltaDrop> TakeDrops();

  // What each heard learner's SyncerStatus ack says (LearnerName, incarnation, heard seq, pending).
  std::vector<LearnerAck> Acks() const;
  // Heard within the heartbeat timeout and not stopping or finished.
  bool Live(int learner, SyncTime now) const;
  // The step of its latest heartbeat (0: none yet).
  uint64_t LastStep(int learner) const { return learners_[learner].beat.step; }
  bool Heard(int learner) const { return learners_[learner].heard; }
  uint64_t Incarnation(int learner) const { return learners_[learner].incarnation; }  // 0: not heard
  // Said kStopping, kFinished or kFailed (its last delta, if pending, is still merged).
  bool Finished(int learner) const { return learners_[learner].finished; }
  bool AllDone() const;  // every learner said kFinished
  // When learner's delta for fragment should arrive, from its last heartbeat (none: unknown, or
  // its delta for the fragment is in flight).
  std::optional<SyncTime> ExpectedDeltaAt(int learner, uint32_t fragment) const;
  // Where a lock-step fleet's cadence stands (0: no merge yet): the step before the earliest
  // round not merged yet (per fragment, the firing after its last merged deltas' LastFiring).
  // Sent with snapshots, so a rejoining learner starts there and fires into every round still to
  // merge (found by dilococtl dst --seed 444: rejoining at its own old step, it was out of step
  // with every round, and lock-step rounds waited on each other). Not the furthest merged step:
  // rounds merge out of step order, and one still open would wait for a delta the rejoined learner
  // fires only H steps later (seeds 413, 955); what it fires into a round already merged is
  // dropped as late.
  uint64_t CadenceStep() const;
  // Decoupled: where the fleet's steps stand now (0: no learner training), the snapshot's cadence
  // for a rejoining learner, which takes its phase (LearnerCore::StartStep). The median over the
  // live training learners of each one's last reported step plus the whole steps since, at its
  // step time: the merged cadence lags the fleet by up to H / P steps, and so would the rejoiner.
  uint64_t FleetStep(SyncTime now) const;
  const RoundBookOptions& options() const { return options_; }

 private:
  struct Beat {
    bool have = false;
    SyncTime at;
    uint64_t step = 0;
    double step_ms = 0;
    std::vector<FragmentCounters> fragments;  // indexed by fragment (absent ones zero)
    std::vector<bool> listed;                 // the beat named the fragment
    std::vector<bool> in_flight;              // per fragment
    LearnerState state = LearnerState::kJoining;
  };
  struct LearnerBook {
    bool heard = false;
    uint64_t incarnation = 0;
    SyncTime last_heard;
    uint64_t heard_seq = 0;
    // When this incarnation replaced an earlier one (a restart): a round already open then does
    // not wait for it (it rejoins out of step; lock-step rounds would deadlock on it).
    std::optional<SyncTime> rejoined_at;
    bool finished = false;  // stopping / finished / failed: not waited for
    bool done = false;      // finished
    Beat beat;
  };
  void Drop(int learner, uint32_t fragment, uint64_t base, double tokens, std::string why, std::string detail,
            bool rejected, bool tell);
  // Empty when plausible, else why not (the detail of an implausible_counts drop).
  std::string CheckCountsOf(const DeltaArrival& d) const;
  bool IsLate(const DeltaArrival& d) const;
  bool PassedRound(const LearnerBook& lb, uint32_t fragment) const;
  bool FlushingWorkFor(const LearnerBook& lb, uint32_t fragment) const;

  RoundBookOptions options_;
  std::vector<LearnerBook> learners_;
  std::vector<std::vector<PendingDelta>> pending_;  // per fragment
  std::vector<NormFilter> filters_;                 // per fragment
  std::vector<DeltaDrop> drops_;
  std::vector<uint64_t> merged_step_;  // per fragment: LastFiring of its last merged deltas
  // [learner][fragment]: the latest learner_step merged, kept across the learner's restarts.
  std::vector<std::vector<uint64_t>> counted_through_;
};

}  // namespace diloco
