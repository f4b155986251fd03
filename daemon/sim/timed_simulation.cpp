#include "daemon/sim/timed_simulation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>

#include "daemon/sim/fragment_costs.h"
#include "daemon/sync/drop_reasons.h"
#include "daemon/train/trainer.h"
#include "daemon/virt/timed_world.h"
#include "kernels/gpt.h"

namespace diloco {

namespace {

constexpr double kNsPerS = 1e9;

// The run config the cores run with: the scenario's times, links and slowdowns.
RunConfig TimedRunConfig(const Scenario& s) {
  RunConfig cfg = s.run;
  const int M = cfg.sync.learners;
  cfg.timing.step_ms = s.step_s * 1e3;
  cfg.timing.step_jitter = std::min(0.99, std::sqrt(3.0) * s.step_jitter);
  cfg.timing.heartbeat_ms = s.heartbeat_s * 1e3;
  cfg.timing.merge_gbps = s.merge_gbps;
  cfg.timing.seed = s.seed;
  cfg.timing.link = cfg.sync.link.bandwidth_mbps > 0 ? cfg.sync.link
                                                      : LinkConfig{s.wan_gbps * 1e3, s.wan_latency_ms, 0, 0};
  std::vector<LearnerConfig> learners;
  for (int l = 0; l < M; l++) {
    LearnerConfig lc = LearnerConfigOf(cfg.learners, l);
    if (l >= M - s.stragglers) lc.slowdown *= s.straggler_factor;
    learners.push_back(lc);
  }
  cfg.learners = learners;
  cfg.sync.merge_threads = 1;  // a tiny model merges in microseconds: threads only cost wake-ups
  cfg.train.time_limit_s = 0;
  if (s.hours > 0) cfg.train.steps = std::numeric_limits<int>::max();  // the clock ends the run
  return cfg;
}

// Learner l's next chip failure, from now (exponential, rate chips / M / chip_mtbf): it is down
// for detect_s + restart_s + rejoin_s.
void ScheduleFailure(const Scenario& s, TimedWorld& world, std::mt19937_64& rng, int l) {
  if (s.chip_mtbf_h <= 0) return;
  std::exponential_distribution<double> d((s.chips / world.learners()) / (s.chip_mtbf_h * 3600));
  world.KillLearnerAt(world.scheduler().now_ns() + (int64_t)(d(rng) * kNsPerS), l,
                      (int64_t)((s.detect_s + s.restart_s + s.rejoin_s) * kNsPerS));
}

// The run config's scripted kills (seconds since the start), as `dilococtl train` plays them.
void ScheduleChaosKills(const RunConfig& cfg, TimedWorld& world) {
  for (const ChaosEvent& ce : cfg.chaos.events) {
    if (ce.kind != ChaosEventKind::kKill || ce.at_step >= 0 || ce.learner < 0 || ce.learner >= world.learners())
      continue;
    world.KillLearnerAt((int64_t)(ce.at_s * kNsPerS), ce.learner,
                        ce.restart_after_s < 0 ? -1 : (int64_t)(ce.restart_after_s * kNsPerS));
  }
}

double SecondsOfUnixMs(int64_t unix_ms) { return (double)(unix_ms - VirtualScheduler::kEpochUnixMs) / 1e3; }

// Goodput's records from the syncer's merges and the learners' results, and the merge figures.
Status Account(const Scenario& s, const RunConfig& cfg, const FragmentCosts& costs, TimedWorld& world,
               SimResult* out) {
  const int M = world.learners();
  const double tokens_per_step = (double)LearnerTokensPerStep(cfg);
  std::vector<MergeEvent> merges;  // every shard's
  for (int sh = 0; sh < world.shards(); sh++)
    merges.insert(merges.end(), world.syncer(sh).merges().begin(), world.syncer(sh).merges().end());
  double end_s = s.hours * 3600;
  if (s.hours <= 0) {  // the run ends with its last step or merge
    end_s = 0;
    for (int i = 0; i < M; i++)
      for (const auto& l : world.incarnations(i)) end_s = std::max(end_s, (double)l->last_step_ns() / kNsPerS);
    for (const MergeEvent& m : merges) end_s = std::max(end_s, SecondsOfUnixMs(m.time_ms));
  }
  GoodputInput in;
  in.wall_s = std::max(end_s, 1e-3);
  uint64_t contributors = 0;
  for (const MergeEvent& m : merges) {
    const double t = SecondsOfUnixMs(m.time_ms);
    if (t > in.wall_s) continue;  // still merging when the run ended
    out->merges++;
    contributors += m.contributors.size();
    for (const MergeContributor& c : m.contributors) {
      in.merged.push_back({t, m.fragment, c.learner, c.tokens});
      if (out->staleness.size() <= c.staleness) out->staleness.resize(c.staleness + 1, 0);
      out->staleness[c.staleness]++;
    }
    for (const SkippedDelta& k : m.skipped) {
      if (DropKeepsWork(k.why)) continue;  // its work travels in the learner's next delta
      out->dropped_deltas++;
      if (k.tokens > 0) in.lost.push_back({t, m.fragment, k.learner, k.tokens, LossCause::kDropped});
    }
  }
  out->contributors_mean = out->merges ? (double)contributors / out->merges : 0;
  auto clip = [&](double t) { return std::clamp(t, 0.0, in.wall_s); };
  for (int i = 0; i < M; i++) {
    for (const auto& [a, b] : world.down_spans()[i])
      if ((double)a / kNsPerS < in.wall_s)
        in.spans.push_back({i, clip(a / kNsPerS), b < 0 ? in.wall_s : clip(b / kNsPerS), Activity::kDown});
    for (const auto& l : world.incarnations(i)) {
      const LearnerResult& r = l->result();
      const double gone_s = r.crashed ? SecondsOfUnixMs(r.crashed_unix_ms) : in.wall_s;
      for (const auto& [a, b] : r.blocked_unix_ms)
        if (SecondsOfUnixMs(a) < in.wall_s)
          in.spans.push_back({i, clip(SecondsOfUnixMs(a)), clip(SecondsOfUnixMs(b)), Activity::kBlocked});
      if (l->blocked_since_ns() >= 0 && (double)l->blocked_since_ns() / kNsPerS < gone_s)
        in.spans.push_back({i, clip(l->blocked_since_ns() / kNsPerS), clip(gone_s), Activity::kBlocked});
      if (r.crashed && SecondsOfUnixMs(r.crashed_unix_ms) <= in.wall_s)
        for (size_t p = 0; p < r.unsent_tokens_at_crash.size(); p++)
          if (r.unsent_tokens_at_crash[p] > 0)
            in.lost.push_back({SecondsOfUnixMs(r.crashed_unix_ms), (int)p, i, (double)r.unsent_tokens_at_crash[p],
                               LossCause::kCrashed});
    }
    // Done with its steps while the run goes on: idle (as a real run's accounting says).
    const LearnerResult& last = world.incarnations(i).back()->result();
    if (!last.crashed && last.end_unix_ms > 0 && SecondsOfUnixMs(last.end_unix_ms) < in.wall_s)
      in.spans.push_back({i, SecondsOfUnixMs(last.end_unix_ms), in.wall_s, Activity::kIdle});
  }
  // The scenario's stragglers are its faults, not its hardware: every learner is provisioned at
  // the scenario's step time (their slowdown here stands for what chaos does to a real run).
  in.nominal_tokens_per_s.assign(M, NominalTokensPerS(tokens_per_step, s.step_s));
  in.fragment_weights = costs.weights;
  in.expected_merge_interval_s = cfg.sync.inner_steps * s.step_s / costs.weights.size();
  DL_RETURN_IF_ERROR(ComputeGoodput(in, &out->goodput));
  double bytes = 0;
  for (int i = 0; i < M; i++) {
    const VirtualLink& up = world.network().uplink(i);
    const VirtualLink& down = world.network().downlink(i);
    out->peak_wan_gbps = std::max({out->peak_wan_gbps, up.PeakGbps(), down.PeakGbps()});
    bytes += (double)up.payload_bytes() + (double)down.payload_bytes();
  }
  out->mean_wan_gbps = bytes * 8 / in.wall_s / 1e9 / (2 * M);
  for (int sh = 0; sh < world.shards(); sh++)
    out->peak_syncer_gbps = std::max({out->peak_syncer_gbps, world.network().shard_ingress(sh).PeakGbps(),
                                      world.network().shard_egress(sh).PeakGbps()});
  out->failures = world.kills();
  out->events = world.scheduler().events_run();
  return Status::Ok();
}

}  // namespace

Status SimulateTimed(const Scenario& s, SimResult* out) {
  const RunConfig cfg = TimedRunConfig(s);
  std::vector<Fragment> fragments;
  DL_RETURN_IF_ERROR(PartitionFragments(gpt_tensor_table(GptConfigOf(cfg.model)), EffectiveFragments(cfg.sync),
                                        &fragments,
                                        s.balanced_fragments ? PartitionRule::kBalanced : PartitionRule::kWholeTensors));
  out->fragments = (int)fragments.size();
  out->fragment_imbalance = FragmentImbalance(fragments);
  out->learners = cfg.sync.learners;
  out->syncers = cfg.sync.syncers;
  const FragmentCosts costs = FragmentCostsOf(fragments, cfg.sync);
  TimedWorldOptions wo;
  wo.config = &cfg;
  wo.delta_bytes = costs.delta_bytes;
  wo.global_bytes = costs.global_bytes;
  wo.merge_bytes = costs.merge_bytes;
  // wan_window_s 0: one fragment interval, the time between two fragments' sends.
  wo.window_s = s.wan_window_s > 0 ? s.wan_window_s : cfg.sync.inner_steps * s.step_s / (double)fragments.size();
  out->wan_window_s = wo.window_s;
  wo.end_s = s.hours > 0 ? s.hours * 3600 : 0;
  std::mt19937_64 rng(s.seed);
  std::unique_ptr<TimedWorld> world;
  TimedWorld* w = nullptr;
  wo.on_restart = [&](int l) { ScheduleFailure(s, *w, rng, l); };  // drawn again from each restart
  DL_RETURN_IF_ERROR(TimedWorld::Create(wo, &world));
  w = world.get();
  for (int l = 0; l < world->learners(); l++) ScheduleFailure(s, *world, rng, l);
  ScheduleChaosKills(cfg, *world);
  DL_RETURN_IF_ERROR(world->Run());
  return Account(s, cfg, costs, *world, out);
}

}  // namespace diloco
