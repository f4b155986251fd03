#include "daemon/config/chaos_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

namespace diloco {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

bool IsEndOrRestart(ChaosActionKind kind) { return FollowUpOf(kind) == kind; }

// start + delay, but never equal to start: a zero or rounded-away delay must not let the sort put
// an end before its own start.
double After(double start_s, double delay_s) {
  return std::max(start_s + delay_s, std::nextafter(start_s, kInfinity));
}

// An exponential draw with the given mean, by inverting the CDF: std::exponential_distribution
// differs between standard libraries, and the timeline must not. u is in (0, 1): the draw is > 0.
double Exponential(std::mt19937_64& rng, double mean) {
  const double u = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
  return -mean * std::log1p(-u);
}

// Each learner's failures come from its own stream, so adding learners leaves the others' alone.
std::mt19937_64 LearnerRng(uint64_t seed, int learner) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(learner)};
  return std::mt19937_64(seq);
}

ChaosActionKind StartOf(ChaosEventKind kind) {
  switch (kind) {
    case ChaosEventKind::kKill:
      return ChaosActionKind::kKill;
    case ChaosEventKind::kSlow:
      return ChaosActionKind::kSlowStart;
    case ChaosEventKind::kPartition:
      return ChaosActionKind::kPartitionStart;
    case ChaosEventKind::kDrop:
      return ChaosActionKind::kDropStart;
    case ChaosEventKind::kCorrupt:
      return ChaosActionKind::kCorruptStart;
    case ChaosEventKind::kSyncerKill:
      return ChaosActionKind::kSyncerKill;
  }
  return ChaosActionKind::kKill;
}

// Seconds from an event's start to its follow-up; < 0 when there is none.
double FollowUpDelay(const ChaosEvent& e) {
  const bool kills = e.kind == ChaosEventKind::kKill || e.kind == ChaosEventKind::kSyncerKill;
  return kills ? e.restart_after_s : e.duration_s;
}

double ValueOf(const ChaosEvent& e) {
  if (e.kind == ChaosEventKind::kSlow) return e.factor;
  if (e.kind == ChaosEventKind::kDrop || e.kind == ChaosEventKind::kCorrupt) return e.prob;
  return 0;
}

std::string Seconds(double s) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.3f", s);
  std::string text = buffer;
  text.erase(text.find_last_not_of('0') + 1);  // "30.000" -> "30", "2.500" -> "2.5"
  if (text.back() == '.') text.pop_back();
  return text + "s";
}

}  // namespace

ChaosActionKind FollowUpOf(ChaosActionKind kind) {
  switch (kind) {
    case ChaosActionKind::kKill:
      return ChaosActionKind::kRestart;
    case ChaosActionKind::kSlowStart:
      return ChaosActionKind::kSlowEnd;
    case ChaosActionKind::kPartitionStart:
      return ChaosActionKind::kPartitionEnd;
    case ChaosActionKind::kDropStart:
      return ChaosActionKind::kDropEnd;
    case ChaosActionKind::kCorruptStart:
      return ChaosActionKind::kCorruptEnd;
    case ChaosActionKind::kSyncerKill:
      return ChaosActionKind::kSyncerRestart;
    default:
      return kind;
  }
}

std::vector<ChaosAction> ExpandChaos(const ChaosConfig& chaos, int learners, double horizon_s) {
  std::vector<ChaosAction> actions;
  for (const ChaosEvent& e : chaos.events) {
    ChaosAction start;
    start.kind = StartOf(e.kind);
    start.learner = e.kind == ChaosEventKind::kSyncerKill ? -1 : e.learner;
    if (e.kind == ChaosEventKind::kSyncerKill) start.shard = e.shard;
    start.value = ValueOf(e);
    const double delay_s = FollowUpDelay(e);
    if (e.at_step >= 0) {
      start.step = e.at_step;
      start.follow_up_after_s = delay_s;
      actions.push_back(start);
      continue;
    }
    start.time_s = e.at_s;
    actions.push_back(start);
    if (delay_s >= 0) {
      ChaosAction end = start;
      end.kind = FollowUpOf(start.kind);
      end.time_s = After(e.at_s, delay_s);
      actions.push_back(end);
    }
  }

  const RandomFailureConfig& r = chaos.random;
  const double until_s = r.until_s > 0 ? r.until_s : horizon_s;
  if (r.mtbf_s > 0 && std::isfinite(until_s)) {
    for (int learner = 0; learner < learners; ++learner) {
      std::mt19937_64 rng = LearnerRng(chaos.seed, learner);
      // Up time runs from the last restart, so one learner's outages never overlap.
      double up_since_s = r.from_s;
      while (true) {
        const double kill_s = up_since_s + Exponential(rng, r.mtbf_s);
        if (kill_s >= until_s) break;
        const double restart_s = After(kill_s, Exponential(rng, r.mttr_s));
        actions.push_back({ChaosActionKind::kKill, learner, 0, kill_s});
        actions.push_back({ChaosActionKind::kRestart, learner, 0, restart_s});
        up_since_s = restart_s;
      }
    }
  }

  std::stable_sort(actions.begin(), actions.end(), [](const ChaosAction& a, const ChaosAction& b) {
    const bool a_step = a.step >= 0, b_step = b.step >= 0;
    if (a_step != b_step) return b_step;
    if (a_step) return a.step < b.step;
    if (a.time_s != b.time_s) return a.time_s < b.time_s;
    return IsEndOrRestart(a.kind) && !IsEndOrRestart(b.kind);
  });
  return actions;
}

std::string ChaosSummary(const std::vector<ChaosAction>& actions) {
  std::string text;
  for (const ChaosAction& a : actions) {
    text += a.step >= 0 ? "step " + std::to_string(a.step) : "t=" + Seconds(a.time_s);
    text += ' ';
    text += ToString(a.kind);
    const bool syncer =
        a.kind == ChaosActionKind::kSyncerKill || a.kind == ChaosActionKind::kSyncerRestart;
    if (!syncer) text += a.learner < 0 ? " all learners" : " learner " + std::to_string(a.learner);
    if (syncer && a.shard >= 0) text += " shard " + std::to_string(a.shard);
    char value[64];
    if (a.kind == ChaosActionKind::kSlowStart) {
      std::snprintf(value, sizeof(value), " factor %g", a.value);
      text += value;
    } else if (a.kind == ChaosActionKind::kDropStart || a.kind == ChaosActionKind::kCorruptStart) {
      std::snprintf(value, sizeof(value), " prob %g", a.value);
      text += value;
    }
    if (a.step >= 0 && a.follow_up_after_s >= 0) {
      text += ", ";
      text += ToString(FollowUpOf(a.kind));
      text += ' ' + Seconds(a.follow_up_after_s) + " later";
    }
    text += '\n';
  }
  return text;
}

}  // namespace diloco
