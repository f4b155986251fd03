// Deterministic simulation testing (`dilococtl dst`), as FoundationDB and TigerBeetle test
// themselves: each seed draws a deployment (mode, learners, fragments, cadence, quorum, grace,
// codecs, step times, links) and a fault schedule (learner kills and restarts, partitions, lossy
// links), runs the real learner and syncer cores on a tiny model under the virtual clock, and
// checks invariants after every event:
//   versions     every fragment's versions are published once each, in order (no version twice,
//                none going back);
//   merged-once  no delta (learner, fragment, base, steps, tokens) is merged twice;
//   same-bits    no learner finds a Global whose bits differ from its own (CRC mismatches) and
//                none refuses one;
//   progress     every learner that finished trained to train.steps and applied Globals when
//                there were merges;
//   end          the job ends within a merge interval (plus the links' round trip and a
//                heartbeat timeout) of its last learner's last step.
// A failing seed prints the one command that replays it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"

namespace diloco {

// One drawn case: the run config and its faults (virtual seconds).
struct DstFault {
  enum Kind { kKill, kPartition } kind = kKill;
  int learner = 0;
  double at_s = 0;
  double for_s = 0;  // down (then restarted) / partitioned (then healed)
};

struct DstCase {
  uint64_t seed = 0;
  RunConfig config;
  std::vector<DstFault> faults;
};

struct DstViolation {
  std::string invariant;  // versions, merged-once, same-bits, progress, end, error
  std::string detail;
  double at_s = 0;  // virtual time
};

struct DstCaseResult {
  std::vector<DstViolation> violations;
  uint64_t events = 0;
  uint64_t merges = 0;
  double virtual_s = 0;
};

// Draws case `seed` over base (its data.corpus is used; everything the draw sets is replaced).
DstCase DrawDstCase(uint64_t seed, const RunConfig& base);
// One line describing the case (mode, M, P, H, K, codecs, faults).
std::string DescribeDstCase(const DstCase& c);
// Runs it in scratch_dir (created, emptied first).
Status RunDstCase(const DstCase& c, const std::string& scratch_dir, DstCaseResult* out);
// The tiny model and generated corpus DST runs on, in dir (written once).
Status DstBaseConfig(const std::string& dir, RunConfig* out);

}  // namespace diloco
