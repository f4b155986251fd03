#include "daemon/train/ring_control.h"

#include <string>

namespace diloco {

CommStatus ExchangeRingHeader(LocalComm& comm, RingHeader* h) {
  if (comm.world_size() == 1) return CommStatus::Ok();
  if (comm.rank() != 0) *h = RingHeader{};
  // The followers wait here for rank 0's next step or command, however long its hook takes.
  return comm.wait_command_host(h->slot, kRingSlots);
}

Status ServeRing(LocalComm& comm, RingCommandHandler& handler) {
  for (;;) {
    RingHeader h;
    if (CommStatus st = ExchangeRingHeader(comm, &h); !st.ok())
      return Status::Error("rank " + std::to_string(comm.rank()) + " waiting for rank 0's commands: " + st.error);
    const int command = (int)h.slot[kRingCommand];
    if (command == kRingRelease) return Status::Ok();
    if (command == 0)
      return Status::Error("rank " + std::to_string(comm.rank()) +
                           " got a step's header after the loop ended; this is a bug");
    DL_RETURN_IF_ERROR(handler.Serve(h));
  }
}

CommStatus ReleaseFollowers(LocalComm& comm) {
  RingHeader h;
  h.slot[kRingCommand] = kRingRelease;
  return ExchangeRingHeader(comm, &h);
}

}  // namespace diloco
