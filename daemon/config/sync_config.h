// The `sync` section of a run config and the per-learner `learners` list:
// how M learners and the syncer train one model (DESIGN.md §3). With the
// default `sync.learners: 1` a run is the single-learner trainer, unchanged.
//
//   sync:
//     mode: decoupled          # ddp | diloco | streaming | decoupled
//     learners: 1              # M
//     fragments: 4             # P (diloco uses 1)
//     inner_steps: 25          # H
//     overlap: 2               # tau: inner steps a delta may be in flight
//     quorum: 1                # K (decoupled; the lock-step modes wait for every live learner)
//     grace: {gamma: 0.5, cap_ms: 2000}   # also cap_steps: 0 (paper: ~1), step_time: slowest | mean,
//                                         # forecast: true (wait for learners whose delta is due),
//                                         # straggler_ratio: 2 (not for learners 2x slower than the fleet)
//     max_staleness: 4         # versions; older deltas are dropped
//     weighting: tokens        # tokens (c_tok^2 / c_steps) | uniform
//     merge: rda               # rda | mean | contributors (per coordinate: the mean over the
//                              # deltas that sent it, for sparse uplinks)
//     fold: overwrite          # overwrite | replay | mix
//     alpha: 0.5               # fold: mix keeps alpha of the local fragment
//     age_power: 0             # weight x (1 + versions behind)^-age_power; 0 = off
//     anchor: base             # base | current (re-anchor: Δ + Θ_current − Θ_base)
//     partial: full            # full | share (a round of k of M deltas moves Θ by k/M of its merge)
//     lr_clock: local          # local | global (inner LR schedule follows the fleet's progress)
//     codec: {up: int4, down: int8, block: 64}   # also up_topk / down_topk: f in (0, 1) sends
//                                                # only the largest f of the values (0 = dense);
//            # up/down: topk_chunked sends of each chunk of `chunk` values the `keep` largest as
//            # `bits`-bit codes (chunk: 4096, keep: 64, bits: 2 = 0.028 B/param);
//            # feedback: residual | accumulate (e <- decay e + delta), decay: 0.95
//     outer: {lr: 0.7, momentum: 0.9}   # also restart_every: N (zero u every N-th merge)
//     link: {bandwidth_mbps: 0, latency_ms: 0, jitter_ms: 0, loss: 0}   # 0 = unlimited / none
//     heartbeat_timeout_ms: 3000
//     norm_limit: 10           # reject deltas whose norm > norm_limit x median; 0 = off
//     checkpoint_every: 50     # merges between global-state checkpoints; 0 = only at the end
//     merge_threads: 2         # threads of one merge (split by tensor ranges; same bits for any count)
//     syncers: 1               # syncer shards, each merging its share of the fragments (by bytes)
//     clock: wall              # wall | virtual (time from the run config's `timing:` section)
//   learners:                  # optional, at most sync.learners entries, by learner index
//     - {slowdown: 3}          # stretch this learner's step time 3x (a slower site)
//     - {jitter: 0.1}          # and each step by 1 + e, e exponential with mean 0.1 (noise)
//     - {link: {bandwidth_mbps: 100, latency_ms: 80}}   # sync.clock virtual: this learner's link
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "daemon/net/codec_kind.h"

namespace diloco {

enum class SyncMode { kDdp, kDiloco, kStreaming, kDecoupled };
enum class Weighting { kTokens, kUniform };
// kContributors: each coordinate the weighted mean over the deltas that sent it (a value other
// than 0), as sparse recipes merge (templar's scatter_reduce mean): with nearly disjoint top-k
// supports a plain mean shrinks every sent value about M times. Meant for sparse uplinks: under a
// dense quantizing codec a value rounded to 0 counts as not sent.
enum class MergeRule { kRda, kMean, kContributors };
enum class FoldRule { kOverwrite, kReplay, kMix };
// Where a delta is anchored at the merge: the learner's base version (Δ as sent), or the
// fragment's current version (Δ + Θ_current − Θ_base: the paper's outer gradient).
enum class Anchor { kBase, kCurrent };
// The clock of a learner's inner LR schedule: its own step count, or the fleet's progress: the mean
// of its own step and the latest step it knows of each other learner (the syncer's status lists
// each live learner's latest heartbeat step).
enum class LrClock { kLocal, kGlobal };
// How far a round of k of the M learners' deltas moves Θ: its whole merged delta (full), or k/M of
// it (share: as if the learners not in it sent zero; their deltas move Θ in a later round).
enum class PartialRound { kFull, kShare };

// Config spellings, indexed by the enum's value.
inline constexpr std::array<std::string_view, 4> kSyncModeNames = {"ddp", "diloco", "streaming",
                                                                   "decoupled"};
inline constexpr std::array<std::string_view, 2> kWeightingNames = {"tokens", "uniform"};
inline constexpr std::array<std::string_view, 3> kMergeRuleNames = {"rda", "mean", "contributors"};
inline constexpr std::array<std::string_view, 3> kFoldRuleNames = {"overwrite", "replay", "mix"};
inline constexpr std::array<std::string_view, 2> kAnchorNames = {"base", "current"};
inline constexpr std::array<std::string_view, 2> kLrClockNames = {"local", "global"};
inline constexpr std::array<std::string_view, 2> kPartialRoundNames = {"full", "share"};
inline constexpr std::array<std::string_view, 2> kFeedbackNames = {"residual", "accumulate"};

inline std::string_view ToString(SyncMode v) { return kSyncModeNames[static_cast<int>(v)]; }
inline std::string_view ToString(Weighting v) { return kWeightingNames[static_cast<int>(v)]; }
inline std::string_view ToString(MergeRule v) { return kMergeRuleNames[static_cast<int>(v)]; }
inline std::string_view ToString(FoldRule v) { return kFoldRuleNames[static_cast<int>(v)]; }
inline std::string_view ToString(Anchor v) { return kAnchorNames[static_cast<int>(v)]; }
inline std::string_view ToString(LrClock v) { return kLrClockNames[static_cast<int>(v)]; }
inline std::string_view ToString(PartialRound v) { return kPartialRoundNames[static_cast<int>(v)]; }

// Where time comes from: the machine's clock (real deployments, local mode), or a seeded
// discrete-event scheduler's virtual clock driven by the run config's `timing:` section (the same
// config and seed give the same bits on any machine, under any load).
enum class ClockSource { kWall, kVirtual };
inline constexpr std::array<std::string_view, 2> kClockSourceNames = {"wall", "virtual"};
inline std::string_view ToString(ClockSource v) { return kClockSourceNames[static_cast<int>(v)]; }

// Where the grace window's ξ_step comes from: the slowest live learner's
// last reported step time (the paper's: the window is for the slow ones), or
// the mean of every heartbeat's (an EMA over all learners).
enum class GraceStepTime { kSlowest, kMean };
inline constexpr std::array<std::string_view, 2> kGraceStepTimeNames = {"slowest", "mean"};
inline constexpr std::array<std::string_view, 2> kBoolNames = {"false", "true"};
inline std::string_view ToString(GraceStepTime v) { return kGraceStepTimeNames[static_cast<int>(v)]; }

struct GraceConfig {
  double gamma = 0.5;  // in [0, 1]: share of the slack the syncer may spend waiting
  int cap_ms = 2000;   // upper bound of the grace window
  // > 0: the cap is also at most this many of the fleet's steps (the paper caps the window near
  // one step); 0: cap_ms alone.
  double cap_steps = 0;
  GraceStepTime step_time = GraceStepTime::kSlowest;
  // Stretch the window (up to the cap) to the forecast arrival of live learners whose delta is
  // due (from their heartbeats).
  bool forecast = true;
  // > 0: the forecast does not wait for a learner whose step time is more than this many times
  // the fleet's (a straggler: the rounds would go at its pace); 0: it waits for every due learner.
  double straggler_ratio = 2;
  bool operator==(const GraceConfig&) const = default;
};

struct CodecConfig {
  CodecKind up = CodecKind::kInt4;    // learner -> syncer deltas
  CodecKind down = CodecKind::kInt8;  // syncer -> learner updates
  int block = kDefaultCodecBlock;     // values per fp32 scale (int8/int4)
  // Top-k (daemon/net/codec.h): 0 = dense; f in (0, 1) keeps the f largest-magnitude values of each
  // tensor (error feedback carries the rest on). The learner applies it on the host: the backend
  // hands over Δ in fp32 and takes top-k Globals as fp32 updates.
  double up_topk = 0;
  double down_topk = 0;
  // topk_chunked (either link): values per chunk (even, in [2, 65536]), values kept of each chunk
  // (in [1, chunk]) and bits of each kept value's code (2, 4 or 8).
  int chunk = 4096;
  int keep = 64;
  int bits = 2;
  // Error feedback on both links: residual (e <- e + delta) or accumulate (e <- decay e + delta,
  // decay in (0, 1]). With accumulate the learner encodes its uplink on the host.
  FeedbackRule feedback = FeedbackRule::kResidual;
  double decay = 0.95;
  bool operator==(const CodecConfig&) const = default;
};

struct OuterConfig {
  double lr = 0.7;        // outer Nesterov learning rate eta
  double momentum = 0.9;  // mu, in [0, 1)
  int restart_every = 0;  // > 0: u_p is zeroed before every restart_every-th merge of p; 0 = never
  bool operator==(const OuterConfig&) const = default;
};

// The emulated WAN under the transport; 0 everywhere = a perfect link.
struct LinkConfig {
  double bandwidth_mbps = 0;  // 0 = unlimited
  double latency_ms = 0;
  double jitter_ms = 0;
  double loss = 0;  // probability a message is lost, in [0, 1)
  bool operator==(const LinkConfig&) const = default;
};

struct SyncConfig {
  SyncMode mode = SyncMode::kDecoupled;
  int learners = 1;
  int fragments = 4;
  int syncers = 1;  // S shards, each merging its share of the fragments (sync/shards.h)
  int inner_steps = 25;
  int overlap = 2;
  int quorum = 1;
  GraceConfig grace;
  int max_staleness = 4;
  Weighting weighting = Weighting::kTokens;
  MergeRule merge = MergeRule::kRda;
  FoldRule fold = FoldRule::kOverwrite;
  double alpha = 0.5;
  // Age-aware scaling: a delta whose base is s versions behind the fragment's current version
  // enters the merge with its weight times (1 + s)^-age_power (not renormalized, so a round of
  // stale deltas moves Θ less); 0 = off.
  double age_power = 0;
  Anchor anchor = Anchor::kBase;
  PartialRound partial = PartialRound::kFull;
  LrClock lr_clock = LrClock::kLocal;
  CodecConfig codec;
  OuterConfig outer;
  LinkConfig link;
  int heartbeat_timeout_ms = 3000;  // a learner silent this long is not waited for
  double norm_limit = 10;           // k of the norm filter; 0 = off
  int checkpoint_every = 50;        // merges; 0 = only at the end
  int merge_threads = 2;            // the syncer's merge pool, in [1, 64]; results do not depend on it
  ClockSource clock = ClockSource::kWall;
  bool operator==(const SyncConfig&) const = default;
};

struct LearnerConfig {
  double slowdown = 1.0;  // >= 1: factor on this learner's step time
  double jitter = 0.0;    // >= 0: mean of the exponential extra fraction on each step (noise)
  // sync.clock virtual: this learner's link to the syncer (both ways) instead of timing.link.
  bool has_link = false;
  LinkConfig link;
  bool operator==(const LearnerConfig&) const = default;
};

// What each mode actually runs with (keys a mode ignores are still validated).
inline int EffectiveFragments(const SyncConfig& s) {
  return s.mode == SyncMode::kDiloco || s.mode == SyncMode::kDdp ? 1 : s.fragments;
}
// The lock-step modes wait for every live learner: K = M.
inline int EffectiveQuorum(const SyncConfig& s) {
  return s.mode == SyncMode::kDecoupled ? s.quorum : s.learners;
}
inline bool UsesGraceWindow(SyncMode mode) { return mode == SyncMode::kDecoupled; }

// Learner i's entry in `learners`, else the defaults (full speed, no noise).
inline LearnerConfig LearnerConfigOf(const std::vector<LearnerConfig>& learners, int i) {
  return i >= 0 && static_cast<size_t>(i) < learners.size() ? learners[i] : LearnerConfig{};
}
inline double SlowdownOf(const std::vector<LearnerConfig>& learners, int i) {
  return LearnerConfigOf(learners, i).slowdown;
}

}  // namespace diloco
