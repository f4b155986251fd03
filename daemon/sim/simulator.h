// `dilococtl simulate`: a discrete-event simulation of a deployment under a virtual clock, to
// ask what goodput a run would keep at a scale this machine cannot run. No model maths: the
// learners are step timers with failures, the links are bandwidth and latency, and payload
// sizes come from the real fragments (PartitionFragments of the run's model) and codecs.
//
// The DiLoCo modes (decoupled, diloco, streaming) run the daemon's own rules: the fragment
// cadence (fragments.h: Fires), the syncer's round book (round_book.h: liveness by heartbeat,
// staleness and count checks, replaced deltas) and its Decide (decide.h: quorum, grace window,
// forecasts) with the run config's settings (DecideOptionsFor, RoundBookOptionsFor), under the
// virtual clock. A merge takes the fragment's fp32 bytes times its contributors over the
// scenario's merge throughput, on the one syncer thread (merges queue). Goodput and uptime are
// ComputeGoodput's (sync/goodput.h) over the simulated records, as for a real run.
//
// Learners: chips / M chips each; a learner fails when any chip does (exponential, rate
// chips_per_learner / chip_mtbf); its unsent work is lost; it is down for detect + restart +
// rejoin (the snapshot) and comes back as a new incarnation with the current global model.
// The syncer notices a dead learner by its heartbeats (sync.heartbeat_timeout_ms). The last
// `stragglers` learners step straggler_factor times slower. Step times are lognormal around
// step_s (step_jitter).
//
// The data-parallel baselines have no syncer: ddp is one synchronous job over every chip (a
// failure anywhere stops everyone for detect + restart + rejoin, and the work since the last
// checkpoint is lost; a straggler slows everyone); elastic ddp splits the chips into
// elastic_slices that drop out on a failure and come back after the restart, everyone pausing
// reconfigure_s at each change (a failure loses the step in progress).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/sim/scenario.h"
#include "daemon/sync/goodput.h"
#include "daemon/util/status.h"

namespace diloco {

enum class SimMode { kDdp, kElasticDdp, kDiloco, kStreaming, kDecoupled };
const char* ToString(SimMode mode);
Status ParseSimMode(const std::string& text, SimMode* out);
// The run config's sync.mode as a SimMode.
SimMode SimModeOf(const RunConfig& run);

struct SimResult {
  SimMode mode = SimMode::kDecoupled;
  int learners = 0;  // M (ddp: 1; elastic ddp: its slices)
  double chips = 0;
  double hours = 0;
  GoodputReport goodput;
  uint64_t merges = 0;          // merges of any fragment (ddp: checkpoints)
  double contributors_mean = 0;  // per merge
  std::vector<uint64_t> staleness;  // staleness[s]: merged deltas s versions behind
  uint64_t failures = 0;
  uint64_t dropped_deltas = 0;  // dropped or refused by the round book (not DropKeepsWork's)
  double peak_wan_gbps = 0;     // busiest link, busiest window (uplink and downlink)
  double mean_wan_gbps = 0;     // mean over links and the whole run
  double wan_window_s = 0;      // the peak's window (scenario wan_window_s; the DiLoCo modes)
  int fragments = 0;            // P (the DiLoCo modes)
  double fragment_imbalance = 0;  // largest fragment / mean (FragmentImbalance)
  bool balanced_fragments = true;  // the partition rule (scenario balanced_fragments)
  double merge_gbps = 0;        // the syncer's merge throughput used
  std::string merge_gbps_source;  // Scenario::merge_gbps_source
  uint64_t events = 0;
  double runtime_s = 0;  // the simulation's own time

  double merges_per_hour() const { return hours > 0 ? merges / hours : 0; }
};

Status Simulate(const Scenario& scenario, SimMode mode, SimResult* out);

// {"mode", "learners", "chips", "hours", "goodput", "uptime", "waste": {...}, "merges",
//  "merges_per_hour", "contributors_mean", "staleness": [...], "failures", "dropped_deltas",
//  "peak_wan_gbps", "mean_wan_gbps", "wan_window_s", "fragments", "fragment_imbalance",
//  "balanced_fragments", "merge_gbps", "merge_gbps_source", "events", "runtime_s"}
nlohmann::json SimResultToJson(const SimResult& r);

}  // namespace diloco
