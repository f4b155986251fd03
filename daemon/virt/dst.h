// Deterministic simulation testing (`dilococtl dst`), as FoundationDB and TigerBeetle test
// themselves: each seed draws a deployment (mode, learners, fragments, cadence, quorum, grace,
// codecs, step times, links) and a fault schedule, runs the real learner and syncer cores on a
// tiny model under the virtual clock, and checks invariants after every event. The faults:
//   kill(i)        learner i dies (kill -9) and a new incarnation joins from a snapshot later;
//   cut(i)         learner i's links lose everything both ways, then heal;
//   loss           every link loses messages with a drawn probability;
//   shards         sync.syncers > 1: each a syncer of its own for its fragments (shards.h);
//   syncer-kill    a syncer shard dies (its round book, pending deltas, timers and what was on its
//                  way to it are gone; what it had sent still arrives) and a new incarnation
//                  resumes from global_state.bin and the update log (update_log.h) later,
//                  checkpointing every few merges so that both the checkpoint and the log count;
//   dup / reorder  every link duplicates messages (a copy arrives up to a window later) and holds
//                  some back (they arrive up to a window late, after messages sent after them):
//                  what reconnections and retransmissions do that one TCP connection does not;
//   jump(role)     a role's steady clock steps forward (a syncer shard's or learner i's): the model is
//                  a process whose VM the host paused and resumed, or a monotonic clock that
//                  counts a suspend. Its virtual time goes on with the scheduler's (nothing it does
//                  is delayed) but every time it reads is later by the jump from then on, so every
//                  deadline it holds comes early at once: the syncer sees every learner's last
//                  word as older (heartbeat timeouts, liveness, grace windows, quorum waits and the
//                  status timer fire early); a learner's snapshot retry, flush and heartbeat
//                  timers do. Clocks never go back (a steady clock does not), and a restarted
//                  learner keeps its machine's clock; a restarted syncer starts on a fresh one.
//                  Times sent in messages (sent_unix_ms) move with the jump.
// The invariants:
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
#include "daemon/virt/virtual_link.h"

namespace diloco {

// One drawn case: the run config and its faults (virtual seconds).
struct DstFault {
  enum Kind { kKill, kPartition, kSyncerKill, kClockJump } kind = kKill;
  int learner = 0;  // kClockJump: -1 - s is syncer shard s; kSyncerKill: the shard
  double at_s = 0;
  double for_s = 0;  // down (then restarted) / partitioned (then healed) / the clock's jump
};

struct DstCase {
  uint64_t seed = 0;
  RunConfig config;
  std::vector<DstFault> faults;
  LinkFaults links;  // duplication and reordering on every link (none: all 0)
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
// One line describing the case (mode, M, P, H, K, codecs, faults, link faults).
std::string DescribeDstCase(const DstCase& c);
// Runs it in scratch_dir (created, emptied first).
Status RunDstCase(const DstCase& c, const std::string& scratch_dir, DstCaseResult* out);
// The tiny model and generated corpus DST runs on, in dir (written once).
Status DstBaseConfig(const std::string& dir, RunConfig* out);

}  // namespace diloco
