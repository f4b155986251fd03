// `dilococtl simulate`: a discrete-event simulation of a deployment under a virtual clock, to
// ask what goodput a run would keep at a scale this machine cannot run.
//
// The DiLoCo modes (decoupled, diloco, streaming) run the virtual runtime with the maths off
// (sim/timed_simulation.h, virt/timed_world.h): the daemon's own LearnerCore for every learner
// (its ledger, fold rule, fragment cadence, drop and resync handling) and its own SyncerCore
// (round book, Decide, merges, status), exchanging real messages over emulated links, under the
// run config's settings. The model they hold is a tiny one with the run's fragment count; what
// the real model costs is charged instead: a Delta or a Global of fragment p takes the wire bytes
// of the real fragment p (PartitionFragments of the run's model, its codecs: fragment_costs.h),
// and a merge its fp32 bytes times its contributors over the scenario's merge throughput, on the
// one syncer thread (merges queue). The results come from what the syncer core recorded (its
// merge events) and each learner incarnation's result; goodput and uptime are ComputeGoodput's
// (sync/goodput.h) over them, as for a real run.
//
// Learners: M = sync.learners, chips / M chips each; a learner fails when any chip does
// (exponential, rate chips_per_learner / chip_mtbf, drawn again from each restart), is killed
// (its unsent work is lost), and a new incarnation rejoins from a snapshot detect + restart +
// rejoin later, at the step it had reached. The syncer notices a dead learner by its heartbeats
// (sync.heartbeat_timeout_ms). The last `stragglers` learners step straggler_factor times
// slower. A step's time is uniform around step_s with coefficient of variation step_jitter.
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
  int syncers = 1;   // S syncer shards (the DiLoCo modes)
  double chips = 0;
  double hours = 0;
  GoodputReport goodput;
  uint64_t merges = 0;          // merges of any fragment (ddp: checkpoints)
  double contributors_mean = 0;  // per merge
  std::vector<uint64_t> staleness;  // staleness[s]: merged deltas s versions behind
  uint64_t failures = 0;
  uint64_t dropped_deltas = 0;  // dropped or refused by the round book (not DropKeepsWork's)
  double peak_wan_gbps = 0;     // busiest link, busiest window (uplink and downlink)
  double peak_syncer_gbps = 0;  // busiest syncer shard host's NIC, busiest window, either way
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

// {"mode", "learners", "syncers", "chips", "hours", "goodput", "uptime", "waste": {...}, "merges",
//  "merges_per_hour", "contributors_mean", "staleness": [...], "failures", "dropped_deltas",
//  "peak_wan_gbps", "peak_syncer_gbps", "mean_wan_gbps", "wan_window_s", "fragments", "fragment_imbalance",
//  "balanced_fragments", "merge_gbps", "merge_gbps_source", "events", "runtime_s"}
nlohmann::json SimResultToJson(const SimResult& r);

}  // namespace diloco
