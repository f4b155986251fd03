// The DiLoCo modes of `dilococtl simulate` (decoupled, diloco, streaming): the scenario mapped
// onto the virtual runtime with the maths off (virt/timed_world.h), so the learner's ledger, its
// fold and cadence, and the syncer's round book, Decide and merges are the daemon's own code.
// The result is read from what the real syncer core recorded (its merge events) and what each
// learner incarnation's core reported.
//
// The mapping: timing.step_ms = step_s, timing.heartbeat_ms = heartbeat_s, timing.merge_gbps =
// merge_gbps, timing.seed = seed; the link of every learner is sync.link when it has a bandwidth,
// else wan_gbps / wan_latency_ms (learners[i].link overrides one learner's); the last
// `stragglers` learners' slowdown is multiplied by straggler_factor. A step's time is uniform
// around step_s with half-width sqrt(3) x step_jitter (at most 0.99), so step_jitter stays its
// coefficient of variation. A learner fails when one of its chips does (exponential, rate
// chips / M / chip_mtbf, drawn again from each restart), is killed, and a new incarnation rejoins
// from a snapshot detect_s + restart_s + rejoin_s later at the step it had reached; the run
// config's chaos kills (at_s) play too. hours > 0: train.steps is unbounded and the run stops at
// that virtual time; hours 0: every learner does train.steps.
#pragma once

#include "daemon/sim/scenario.h"
#include "daemon/sim/simulator.h"

namespace diloco {

// scenario.run.sync.mode is the mode simulated (decoupled, diloco or streaming).
Status SimulateTimed(const Scenario& scenario, SimResult* out);

}  // namespace diloco
