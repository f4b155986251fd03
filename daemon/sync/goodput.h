// Goodput and uptime of a run: how much of the compute we paid for reached
// the global model, and how much of the time the global model kept moving.
// A pure unit over plain records (no clock, no files) so every rule is a
// table row in a test; GoodputRecordsOf turns the syncer's merges into its
// records (merge_tape.h keeps them for a running job). All times are seconds
// since the run start; tokens are counts.
//
// Definitions (M learners, P fragments with weights w_p = numel share):
//   provisioned_tokens = Σ_l nominal_tokens_per_s[l] × wall_s
//     (nominal = the learner's fault-free rate: NominalTokensPerS below).
//   merged_tokens = Σ_p w_p × Σ_{deltas of p merged} tokens
//     (a token trains every fragment, so it only fully counts once every
//     fragment's delta carrying it has been merged).
//   goodput = merged_tokens / provisioned_tokens.
//   uptime = share of [0, wall_s] in which the global model was "up": t is up
//     when some merge (any fragment) happened in (t − 2·I, t], I =
//     expected_merge_interval_s (between merges of any fragment, e.g.
//     H × step time / P for P staggered fragments).
//     Start rule: time 0 counts as a merge, so [0, 2·I) is up; the run is
//     charged only for a first merge later than 2·I. The end is wall_s.
//     So a gap of g > 2·I between merges costs exactly g − 2·I seconds.
//   waste, each a share of provisioned_tokens:
//     down      = Σ_l nominal[l] × seconds learner l was kDown
//                 + Σ_p w_p × tokens a learner trained but had not sent when it died (kCrashed)
//     blocked   = Σ_l nominal[l] × seconds learner l was kBlocked
//     dropped   = Σ_p w_p × tokens of p's deltas the syncer dropped
//     discarded = Σ_p w_p × tokens of p's work the learner's fold discarded
//     idle      = Σ_l nominal[l] × seconds learner l was kIdle (finished its
//                 train.steps while the run went on, e.g. waiting for a
//                 restarted learner to catch up)
//   The shares need not add up to 1 − goodput: work in flight at the end,
//   kSyncing time and unlogged losses are in neither.
//
// Input rules (ComputeGoodput refuses the rest with a message naming the
// record): wall_s > 0; expected_merge_interval_s > 0; at least one learner
// and a positive total nominal rate; fragment weights >= 0 summing to 1
// within 1e-6; every time and token count finite and >= 0; learner and
// fragment indices in range; a learner's spans do not overlap. Spans are
// clipped to wall_s (the last span of a learner is often still open when the
// run is cut); merges and lost deltas after wall_s are refused (they mean
// wall_s is wrong, and counting them would let goodput pass 1).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/sync/event_log.h"
#include "daemon/util/status.h"

namespace diloco {

// A learner's nominal rate, the one definition every runtime uses (local, virtual, a daemon job's
// syncer from heartbeats): its tokens over its provisioned time, the time its steps took on the
// hardware it was given. That is each step's own time stretched by its configured slowdown and
// step noise (learners[i].slowdown, jitter; a virtual step's drawn time), since slower hardware is
// what was provisioned; but not by a chaos slowdown (a fault: it shows as goodput lost), and not
// counting time spent waiting at a barrier, syncing or down (those are waste).
inline double NominalTokensPerS(double tokens, double provisioned_s) {
  return provisioned_s > 0 ? tokens / provisioned_s : 0;
}

// kSyncing: snapshot install etc.; kIdle: done with its steps while the run goes on
enum class Activity { kTraining, kDown, kBlocked, kSyncing, kIdle };
// dropped by the syncer / discarded (the fold, a rollback) / lost with a learner that died
// before sending it (counted as `down` waste: it is the failure's cost too)
enum class LossCause { kDropped, kDiscarded, kCrashed };

struct ActivitySpan {
  int learner = 0;
  double start_s = 0;
  double end_s = 0;
  Activity activity = Activity::kTraining;
};

struct MergedDelta {
  double time_s = 0;  // when the merge happened
  int fragment = 0;
  int learner = 0;
  double tokens = 0;  // c_tokens: tokens the learner trained since its base
};

struct LostDelta {
  double time_s = 0;
  int fragment = 0;
  int learner = 0;
  double tokens = 0;
  LossCause cause = LossCause::kDropped;
};

struct GoodputInput {
  double wall_s = 0;
  std::vector<double> nominal_tokens_per_s;  // per learner
  std::vector<double> fragment_weights;      // per fragment, numel share, sums to 1
  double expected_merge_interval_s = 0;      // between merges of any fragment
  std::vector<ActivitySpan> spans;           // kTraining spans are optional
  std::vector<MergedDelta> merged;
  std::vector<LostDelta> lost;
};

struct GoodputReport {
  double goodput = 0;
  double uptime = 0;
  double waste_down = 0;  // shares of provisioned_tokens
  double waste_blocked = 0;
  double waste_dropped = 0;
  double waste_discarded = 0;
  double waste_idle = 0;  // learners done with their steps while others still train
  double merged_tokens = 0;  // fragment-weighted
  double provisioned_tokens = 0;
  std::vector<double> down_s;     // per learner, after clipping to wall_s
  std::vector<double> blocked_s;  // per learner
};

Status ComputeGoodput(const GoodputInput& input, GoodputReport* report);

// One bucket [start_s, end_s) of the run (the last one ends at wall_s, is
// closed, and may be shorter than bucket_s).
struct GoodputPoint {
  double start_s = 0;
  double end_s = 0;
  double goodput = 0;  // merged_tokens of merges in the bucket / provisioned over the bucket
  double uptime = 0;   // share of the bucket the global was up
  bool up = false;     // up for the whole bucket
};

// The same rules as ComputeGoodput, bucket by bucket, for plots. Goodput per
// bucket is bursty (tokens land at merges), so plot it smoothed. Errors on
// the inputs ComputeGoodput refuses and on bucket_s <= 0.
Status GoodputOverTime(const GoodputInput& input, double bucket_s, std::vector<GoodputPoint>* out);

// {"goodput", "uptime", "waste": {"down", "blocked", "dropped", "discarded", "idle"},
//  "merged_tokens", "provisioned_tokens"}
nlohmann::json GoodputToJson(const GoodputReport& report);

// A merge's goodput records: one MergedDelta per contributor, and its skipped deltas that carry
// tokens as kDropped LostDeltas (a "replaced" or "late" delta is not lost: its work travels in the
// learner's next delta, drop_reasons.h); time = (time_ms − run_start_unix_ms) / 1000.
void GoodputRecordsOf(const MergeEvent& event, int64_t run_start_unix_ms, std::vector<MergedDelta>* merged,
                      std::vector<LostDelta>* lost);

// The goodput records of every merge in a finished run's events.log (ReadEventLog's rules).
Status ReadMergedDeltas(const std::string& events_path, int64_t run_start_unix_ms,
                        std::vector<MergedDelta>* out, std::vector<LostDelta>* lost = nullptr);

}  // namespace diloco
