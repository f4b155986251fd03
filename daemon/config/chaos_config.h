// The `chaos` section of a run config: faults injected into a run on purpose, to see how training
// rides through them. The run config's key table (run_config_keys.cpp) has its keys, read,
// checked and written with the rest; this file holds the structs and ExpandChaos, the pure
// function that turns the section into a timeline of fault actions.
//
//   chaos:
//     seed: 1                  # for the random failures
//     events:                  # each: one trigger (at_s or at_step) and one action
//       - {at_s: 30, kill: {learner: 1, restart_after_s: 10}}   # absent / < 0: no restart
//       - {at_step: 200, slow: {learner: 2, factor: 3, duration_s: 20}}
//       - {at_s: 50, partition: {learner: 3, duration_s: 10}}   # both directions of its link
//       - {at_s: 60, drop: {prob: 0.05, duration_s: 30}}        # learner: optional, default all
//       - {at_s: 60, corrupt: {prob: 0.01, duration_s: 10}}     # learner: optional, default all
//       - {at_s: 80, syncer_kill: {restart_after_s: 5}}          # shard: s for one shard of several
//     random: {mtbf_s: 600, mttr_s: 10, from_s: 0, until_s: 0}  # mtbf_s 0: off; until_s 0: end
//
// at_s counts seconds since training started; at_step is a step of the event's own learner, so
// only kill, slow and partition take it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace diloco {

// What a config event does.
enum class ChaosEventKind { kKill, kSlow, kPartition, kDrop, kCorrupt, kSyncerKill };
// Config spellings (the event's action key), indexed by the enum's value.
inline constexpr std::array<std::string_view, 6> kChaosEventNames = {
    "kill", "slow", "partition", "drop", "corrupt", "syncer_kill"};
inline std::string_view ToString(ChaosEventKind v) { return kChaosEventNames[static_cast<int>(v)]; }
// kill, slow and partition act on one learner, whose step at_step counts.
inline bool IsLearnerEvent(ChaosEventKind v) {
  return v == ChaosEventKind::kKill || v == ChaosEventKind::kSlow ||
         v == ChaosEventKind::kPartition;
}

// One scripted fault. Which fields count depends on kind (the others keep their defaults).
struct ChaosEvent {
  double at_s = 0;   // fires this many seconds after training starts, when at_step < 0
  int at_step = -1;  // >= 0: fires when the event's learner reaches this step instead
  ChaosEventKind kind = ChaosEventKind::kKill;
  int learner = -1;             // -1: every learner's link (drop, corrupt); unused by syncer_kill
  double factor = 1;            // slow: step-time multiplier, > 0
  double prob = 0;              // drop, corrupt: per-message probability, in [0, 1]
  double duration_s = 0;        // slow, partition, drop, corrupt: > 0
  double restart_after_s = -1;  // kill, syncer_kill: < 0 = never restarted
  int shard = -1;               // syncer_kill: the syncer shard (sync.syncers > 1); -1: every shard
  bool operator==(const ChaosEvent&) const = default;
};

// Seeded failures of every learner: up times exponential with mean mtbf_s, each followed by an
// outage exponential with mean mttr_s.
struct RandomFailureConfig {
  double mtbf_s = 0;   // mean seconds a learner runs between restart and next failure; 0 = off
  double mttr_s = 10;  // mean seconds until a failed learner is restarted, > 0
  double from_s = 0;   // failures start in [from_s, until_s)
  double until_s = 0;  // 0 = the end of the run
  bool operator==(const RandomFailureConfig&) const = default;
};

struct ChaosConfig {
  uint64_t seed = 1;
  std::vector<ChaosEvent> events;
  RandomFailureConfig random;
  bool empty() const { return *this == ChaosConfig{}; }
  bool operator==(const ChaosConfig&) const = default;
};

// One step of the timeline a runner carries out.
enum class ChaosActionKind {
  kKill,
  kRestart,
  kSlowStart,
  kSlowEnd,
  kPartitionStart,
  kPartitionEnd,
  kDropStart,
  kDropEnd,
  kCorruptStart,
  kCorruptEnd,
  kSyncerKill,
  kSyncerRestart,
};
inline constexpr std::array<std::string_view, 12> kChaosActionNames = {
    "kill",       "restart",  "slow_start",    "slow_end",    "partition_start", "partition_end",
    "drop_start", "drop_end", "corrupt_start", "corrupt_end", "syncer_kill",     "syncer_restart"};
inline std::string_view ToString(ChaosActionKind v) {
  return kChaosActionNames[static_cast<int>(v)];
}
// The action that undoes kind (kill -> restart, slow_start -> slow_end, ...); kind itself for an
// end or a restart.
ChaosActionKind FollowUpOf(ChaosActionKind kind);

struct ChaosAction {
  ChaosActionKind kind = ChaosActionKind::kKill;
  int learner = -1;   // -1: every learner's link (drop, corrupt) or the syncer (syncer_*)
  double value = 0;   // slow: factor; drop, corrupt: prob; else 0
  double time_s = 0;  // seconds since training start; unused when step >= 0
  // >= 0: fires when `learner` reaches this step (an at_step event). Its end or restart depends on
  // when that happens, so it is not in the timeline: the runner schedules FollowUpOf(kind)
  // follow_up_after_s after firing.
  int step = -1;
  double follow_up_after_s = -1;  // step-triggered only; < 0: no follow-up (never restarted)
  int shard = -1;                 // syncer_*: the syncer shard; -1: every shard
  bool operator==(const ChaosAction&) const = default;
};

// The timeline of chaos for a run with `learners` learners lasting at most horizon_s seconds
// (random failures stop there unless random.until_s is set; with neither finite there are none).
// Time-triggered actions come first, by time; at equal times ends and restarts come before starts,
// so back-to-back windows do not overlap, and otherwise config order, then random failures by
// learner. An end is always strictly after its start. Step-triggered actions follow, by step.
// Pure and deterministic: the same config gives the same timeline on every platform.
std::vector<ChaosAction> ExpandChaos(const ChaosConfig& chaos, int learners, double horizon_s);

// One line per action, e.g. "t=30s kill learner 1", for logs.
std::string ChaosSummary(const std::vector<ChaosAction>& actions);

}  // namespace diloco
