// A simulation scenario (`dilococtl simulate`, configs/simulate/*.yaml): a real run config
// (the model's shape, the sync settings the daemon would run: mode, learners, H, fragments,
// quorum, grace, staleness, codecs, links) plus what a simulation needs instead of hardware:
// chips, step times, failures, restarts, stragglers and the syncer's merge throughput. The
// run config's learners[i].slowdown slows learner i as in a real run.
//
//   run: ../shakespeare-m4.yaml     # relative to the scenario file
//   set: [sync.inner_steps=100]     # overrides, as dilococtl --set
//   chips: 1200000                  # in total, split evenly over the learners
//   hours: 24                       # simulated wall time; 0: until every learner did train.steps
//                                   # (the DiLoCo modes; the run ends with the last merge)
//   seed: 1
//   step_s: 1.0                     # mean inner-step time of a learner (fault-free)
//   step_jitter: 0.02               # coefficient of variation of a step's time (uniform, half-width
//                                   # sqrt(3) x step_jitter, at most 0.99: the virtual runtime's draw)
//   chip_mtbf_h: 500000             # mean time between failures of one chip; 0: none
//                                   # (the run config's chaos.events kills, by at_s, play too)
//   detect_s: 30                    # failure -> noticed
//   restart_s: 600                  # noticed -> the failed part runs again
//   rejoin_s: 60                    # a restarted learner fetches the global model (snapshot)
//   stragglers: 0                   # learners slowed by straggler_factor (the last ones)
//   straggler_factor: 2.0
//   checkpoint_every_s: 1800        # ddp: a failure loses the work since the last checkpoint
//   elastic_slices: 64              # elastic ddp: the job shrinks by one slice per failure
//   reconfigure_s: 30               # elastic ddp: everyone pauses this long when it shrinks or grows
//   merge_gbps: 10                  # syncer merge throughput, GB/s of fp32 deltas (bench syncer)
//   merge_bench: PATH               # instead: the merge_GBps of a `dilococtl bench syncer --json`
//                                   # output (relative to the scenario file; no default)
//   wan_gbps: 100                   # a learner's WAN link, when the run config's sync.link has none
//   wan_latency_ms: 50
//   heartbeat_s: 1                  # a learner's heartbeat period
//   wan_window_s: 60                # peak_wan_gbps: the busiest window of this length on the
//                                   # busiest link; 0: one fragment interval (H x step_s / P)
//   balanced_fragments: true        # false: the whole-tensor partition, never cut into row
//                                   # pieces (PartitionRule::kWholeTensors), to compare
//
// Every key but `run` and `merge_bench` has the default shown. Unknown keys and bad values are
// errors naming the file and key. A scenario key can also be given as an override, `--set
// merge_bench=bench.json` (a path there is relative to the working directory); it replaces the
// file's, and merge_gbps and merge_bench replace each other.
#pragma once

#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"

namespace diloco {

struct Scenario {
  std::string path;  // the scenario file
  RunConfig run;     // from `run` with `set` (and the command line's overrides) applied
  double chips = 1;
  double hours = 24;
  uint64_t seed = 1;
  double step_s = 1.0;
  double step_jitter = 0.02;
  double chip_mtbf_h = 500000;
  double detect_s = 30;
  double restart_s = 600;
  double rejoin_s = 60;
  int stragglers = 0;
  double straggler_factor = 2.0;
  double checkpoint_every_s = 1800;
  int elastic_slices = 64;
  double reconfigure_s = 30;
  double merge_gbps = 10;
  double wan_gbps = 100;
  double wan_latency_ms = 50;
  double heartbeat_s = 1;
  double wan_window_s = 60;
  bool balanced_fragments = true;
  // Where merge_gbps came from: "default", "scenario" (the file's merge_gbps), "--set" or the
  // merge_bench file's path.
  std::string merge_gbps_source = "default";
};

// Loads path; run_overrides (key=value) apply to the run config after the file's `set`, except
// those whose key is a scenario key (no dots: `hours=6`, `balanced_fragments=false`), which apply
// to the scenario after the file's keys.
Status LoadScenario(const std::string& path, const std::vector<std::string>& run_overrides, Scenario* out);

// The merge throughput of a `dilococtl bench syncer --json` output: its merge_GBps (> 0).
// Errors name the file and the field.
Status ReadMergeBench(const std::string& path, double* merge_gbps);

}  // namespace diloco
