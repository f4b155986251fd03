// What rank 0 of a learner's ring tells the other ranks, and when (inner_loop.h). Before every
// step rank 0 sends a header: stop, or the step to take and which parameters it changed. Between
// steps, and after the last one until it releases them, it may also send commands that the other
// ranks carry out together with it (outer_state.h: the outer-sync state sharded over the ring).
// A header travels as a wait_command_host (an all_reduce_host sum without a collective's deadline:
// the followers wait as long as rank 0 takes) to which every other rank adds zeros, so every rank
// reads rank 0's doubles exactly (steps, offsets and flags are exact below 2^53).
#pragma once

#include "daemon/util/status.h"
#include "kernels/comm/local_comm.h"

namespace diloco {

enum RingSlot {
  kRingStop,     // 1: end the loop (before this step)
  kRingRanges,   // how many changed parameter ranges follow (broadcast after the header)
  kRingStep,     // the step to take
  kRingLrStep,   // the LR schedule's position, or -1
  kRingCommand,  // 0: the header of a step; else a RingCommand's code and its arguments
  kRingArg0,
  kRingArg1,
  kRingArg2,
  kRingArg3,
  kRingArg4,
  kRingSlots
};

struct RingHeader {
  double slot[kRingSlots] = {};
};

// The command code that ends a follower's service after its loop (ServeRing).
inline constexpr int kRingRelease = 1;

// On rank 0, sends h; on the others, receives it into h (whatever they pass is replaced).
CommStatus ExchangeRingHeader(LocalComm& comm, RingHeader* h);

// A follower's side of rank 0's commands (codes other than 0 and kRingRelease).
class RingCommandHandler {
 public:
  virtual ~RingCommandHandler() = default;
  // Carries out the command in h, with whatever collectives it takes: the same ones, in the same
  // order, that rank 0 runs for it. An error fails the ring.
  virtual Status Serve(const RingHeader& h) = 0;
};

// A follower after its inner loop ended: serves rank 0's commands until rank 0 sends
// kRingRelease (ReleaseFollowers). rank 0 of a ring whose followers serve commands must release
// them when it is done; if it fails instead, the ring is aborted and this returns the error.
Status ServeRing(LocalComm& comm, RingCommandHandler& handler);
CommStatus ReleaseFollowers(LocalComm& comm);

}  // namespace diloco
