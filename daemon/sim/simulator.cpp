#include "daemon/sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>

#include "daemon/sim/timed_simulation.h"
#include "daemon/sync/goodput.h"
#include "daemon/train/trainer.h"

namespace diloco {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ddp and elastic ddp: groups of chips in lock step, no syncer. A "slice" is the unit that
// fails and comes back (ddp: the whole job is one slice). Progress is piecewise constant
// between events, so the loop visits failures, returns and pauses, not steps.
Status SimulateDataParallel(const Scenario& s, bool elastic, SimResult* out) {
  const int S = elastic ? s.elastic_slices : 1;
  const double end = s.hours * 3600;
  const double tokens_per_step = (double)LearnerTokensPerStep(s.run) * s.run.sync.learners;
  const double rate = NominalTokensPerS(tokens_per_step, s.step_s);  // the whole job, fault-free
  // A synchronous job runs at its slowest member's pace.
  const double pace = s.stragglers > 0 ? 1.0 / s.straggler_factor : 1.0;
  // Any chip, the whole job; chip_mtbf_h 0: no failures (as in the DiLoCo modes).
  const double fail_rate_per_s = s.chip_mtbf_h > 0 ? s.chips / (s.chip_mtbf_h * 3600) : 0;
  std::mt19937_64 rng(s.seed);
  std::exponential_distribution<double> failure_gap(fail_rate_per_s > 0 ? fail_rate_per_s : 1);
  auto next_failure = [&](std::mt19937_64& r) { return fail_rate_per_s > 0 ? failure_gap(r) : kInf; };

  GoodputInput in;
  in.wall_s = end;
  in.nominal_tokens_per_s.assign(S, rate / S);
  in.fragment_weights = {1.0};
  in.expected_merge_interval_s = elastic ? s.step_s * 60 : s.checkpoint_every_s;

  std::vector<double> back_at(S, -1);  // < 0: up
  double t = 0, pause_until = 0;
  double fail_at = next_failure(rng);
  double since_checkpoint = 0;      // ddp: tokens not yet in a checkpoint
  double last_checkpoint_t = 0;     // ddp: training time at the last checkpoint
  double trained_since_resume = 0;  // ddp: seconds of training since the last restart
  double record_t = 0, record_tokens = 0;  // elastic: merged tokens batched per minute
  auto up_count = [&] { return (int)std::count_if(back_at.begin(), back_at.end(), [](double b) { return b < 0; }); };
  while (t < end) {
    double next_back = kInf;
    for (double b : back_at)
      if (b >= 0) next_back = std::min(next_back, b);
    // ddp checkpoints every checkpoint_every_s of training (not while it is down).
    const double next_ckpt = elastic || back_at[0] >= 0
                                 ? kInf
                                 : t + (s.checkpoint_every_s - (trained_since_resume - last_checkpoint_t));
    const double next_record = elastic ? record_t + 60 : kInf;
    const double pause_end = pause_until > t ? pause_until : kInf;
    const double next = std::min({end, fail_at, next_back, pause_end, next_ckpt, next_record});
    // Train over [t, next) unless paused.
    const double train_from = std::max(t, pause_until);
    if (next > train_from && (elastic ? up_count() > 0 : back_at[0] < 0)) {
      const double secs = next - train_from;
      const double tokens = rate * pace * secs * up_count() / S;
      if (elastic) {
        record_tokens += tokens;
      } else {
        since_checkpoint += tokens;
        trained_since_resume += secs;
      }
      if (pause_until > t) {  // paused over [t, pause_until), then trained
        for (int i = 0; i < S; i++)
          if (back_at[i] < 0) in.spans.push_back({i, t, pause_until, Activity::kBlocked});
      }
    } else if (next > t && pause_until > t) {
      for (int i = 0; i < S; i++)
        if (back_at[i] < 0) in.spans.push_back({i, t, std::min(next, pause_until), Activity::kBlocked});
    }
    t = next;
    out->events++;
    if (t >= end) break;
    if (elastic && t >= next_record) {
      if (record_tokens > 0) in.merged.push_back({t, 0, 0, record_tokens});
      record_tokens = 0;
      record_t = t;
    }
    if (!elastic && t == next_ckpt) {
      if (since_checkpoint > 0) in.merged.push_back({t, 0, 0, since_checkpoint});
      out->merges++;
      since_checkpoint = 0;
      last_checkpoint_t = trained_since_resume;
    }
    if (t == fail_at) {
      fail_at = t + next_failure(rng);
      std::uniform_int_distribution<int> which(0, S - 1);
      const int slice = which(rng);
      if (back_at[slice] >= 0) continue;  // already down: the restart covers it
      out->failures++;
      const double down_for = s.detect_s + s.restart_s + s.rejoin_s;
      back_at[slice] = t + down_for;
      in.spans.push_back({slice, t, std::min(end, t + down_for), Activity::kDown});
      if (elastic) {
        // The step in progress is lost; everyone pauses while the job shrinks.
        in.lost.push_back({t, 0, slice, rate * pace / S * s.step_s, LossCause::kCrashed});
        pause_until = std::max(pause_until, t + s.detect_s + s.reconfigure_s);
      } else {
        if (since_checkpoint > 0) in.lost.push_back({t, 0, 0, since_checkpoint, LossCause::kCrashed});
        since_checkpoint = 0;
        trained_since_resume = last_checkpoint_t = 0;
      }
      continue;
    }
    for (int i = 0; i < S; i++) {
      if (back_at[i] >= 0 && back_at[i] <= t) {
        back_at[i] = -1;
        if (elastic) pause_until = std::max(pause_until, t + s.reconfigure_s);  // it grows back
      }
    }
  }
  if (since_checkpoint > 0) in.merged.push_back({end, 0, 0, since_checkpoint});  // the final checkpoint
  if (record_tokens > 0) in.merged.push_back({end, 0, 0, record_tokens});
  if (elastic) out->merges = in.merged.size();
  out->contributors_mean = 1;
  return ComputeGoodput(in, &out->goodput);
}

}  // namespace

const char* ToString(SimMode mode) {
  switch (mode) {
    case SimMode::kDdp: return "ddp";
    case SimMode::kElasticDdp: return "elastic-ddp";
    case SimMode::kDiloco: return "diloco";
    case SimMode::kStreaming: return "streaming";
    case SimMode::kDecoupled: return "decoupled";
  }
  return "?";
}

Status ParseSimMode(const std::string& text, SimMode* out) {
  for (SimMode m : {SimMode::kDdp, SimMode::kElasticDdp, SimMode::kDiloco, SimMode::kStreaming, SimMode::kDecoupled}) {
    if (text == ToString(m)) {
      *out = m;
      return Status::Ok();
    }
  }
  return Status::Error("unknown mode '" + text + "': ddp, elastic-ddp, diloco, streaming or decoupled");
}

SimMode SimModeOf(const RunConfig& run) {
  switch (run.sync.mode) {
    case SyncMode::kDdp: return SimMode::kDdp;
    case SyncMode::kDiloco: return SimMode::kDiloco;
    case SyncMode::kStreaming: return SimMode::kStreaming;
    default: return SimMode::kDecoupled;
  }
}

Status Simulate(const Scenario& s, SimMode mode, SimResult* out) {
  const auto t0 = std::chrono::steady_clock::now();
  *out = SimResult();
  out->mode = mode;
  out->chips = s.chips;
  out->hours = s.hours;
  out->merge_gbps = s.merge_gbps;
  out->merge_gbps_source = s.merge_gbps_source;
  out->balanced_fragments = s.balanced_fragments;
  if (mode == SimMode::kDdp || mode == SimMode::kElasticDdp) {
    if (s.hours <= 0) return Status::Error(std::string(ToString(mode)) + " needs hours > 0 (a time-limited run)");
    out->learners = mode == SimMode::kDdp ? 1 : s.elastic_slices;
    DL_RETURN_IF_ERROR(SimulateDataParallel(s, mode == SimMode::kElasticDdp, out));
  } else {
    Scenario scenario = s;
    scenario.run.sync.mode = mode == SimMode::kDiloco      ? SyncMode::kDiloco
                             : mode == SimMode::kStreaming ? SyncMode::kStreaming
                                                           : SyncMode::kDecoupled;
    DL_RETURN_IF_ERROR(SimulateTimed(scenario, out));
  }
  out->runtime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

nlohmann::json SimResultToJson(const SimResult& r) {
  nlohmann::json j = GoodputToJson(r.goodput);
  j["mode"] = ToString(r.mode);
  j["learners"] = r.learners;
  j["syncers"] = r.syncers;
  j["chips"] = r.chips;
  j["hours"] = r.hours;
  j["merges"] = r.merges;
  j["merges_per_hour"] = r.merges_per_hour();
  j["contributors_mean"] = r.contributors_mean;
  j["staleness"] = r.staleness;
  j["failures"] = r.failures;
  j["dropped_deltas"] = r.dropped_deltas;
  j["peak_wan_gbps"] = r.peak_wan_gbps;
  j["peak_syncer_gbps"] = r.peak_syncer_gbps;
  j["mean_wan_gbps"] = r.mean_wan_gbps;
  j["wan_window_s"] = r.wan_window_s;
  j["fragments"] = r.fragments;
  j["fragment_imbalance"] = r.fragment_imbalance;
  j["balanced_fragments"] = r.balanced_fragments;
  j["merge_gbps"] = r.merge_gbps;
  j["merge_gbps_source"] = r.merge_gbps_source;
  j["events"] = r.events;
  j["runtime_s"] = r.runtime_s;
  return j;
}

}  // namespace diloco
