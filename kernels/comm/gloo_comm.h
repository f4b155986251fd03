// A local ring whose ranks are processes, possibly on several hosts, over
// Gloo's TCP transport (kernels/comm/local_comm.h). One GlooCommGroup lives
// in each process and holds that process's ranks of the ring: global ranks
// first_rank .. first_rank + local_ranks - 1, one thread each (the shape of
// ThreadCommGroup); the processes meet through a key/value store.
//
// Results are bitwise those of ThreadCommGroup: no Gloo reduction algorithm
// is used. Every collective is point-to-point transfers on Gloo's unbound
// buffers and the sums run here, in rank order 0, 1, ..., R-1:
//   reduce_scatter  each rank sends part q of its buffer to rank q, which
//                   sums the R copies of its part in rank order
//   all_gather      each rank sends its part to every rank
//   all_reduce      reduce_scatter then all_gather (parts of ceil(n/R))
//   all_reduce_host every rank sends its values to every rank; each sums
//                   them in rank order
//   broadcast       the root sends its buffer to every rank
// Before its data moves, every collective (and barrier, which is only this)
// exchanges a small signature (collective, sizes, root, the split) with every
// rank, so ranks that call different collectives or sizes get an error
// naming the first rank that differs instead of a hang or mixed-up bytes.
//
// Failure and its bounds:
//   - Every collective has one deadline, timeout_ms after it starts; a
//     stalled peer makes it fail then (Gloo closes the context's pairs).
//   - A peer process that exits or is killed closes its sockets: the
//     collectives waiting on it fail at once (Gloo sees EOF), well within
//     the timeout.
//   - abort(reason) (any thread) marks the group aborted, wakes every wait
//     in flight (Gloo's UnboundBuffer::abortWaitRecv / abortWaitSend) and
//     closes this process's connections, so peers' pending collectives fail
//     at once too. Pending collectives here return within milliseconds;
//     later ones fail before touching the network.
//   After any failure a rank's comm keeps failing with the first error: the
//   Gloo context is unusable, so the survivors Create a new group (with a
//   new ring_name, so store keys do not collide).
// Errors name the ring, the global rank and the collective.
//
// Only built when Gloo is found (DILOCO_HAVE_GLOO, target diloco_gloo).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/comm/comm_store.h"
#include "kernels/comm/local_comm.h"

namespace diloco {

struct GlooCommOptions {
  // Names the ring in store keys and in every error. Each new group (e.g.
  // after an abort) needs its own name.
  std::string ring_name = "ring";
  int world_size = 1;   // ranks of the whole ring, over every process
  int first_rank = 0;   // global rank of this process's first rank
  int local_ranks = 1;  // this process's ranks (one thread each)
  // The address the peers reach this process at (an IP or a hostname), or,
  // when interface is set, that network interface's address ("eth0").
  std::string hostname = "127.0.0.1";
  std::string interface;
  int64_t timeout_ms = 30000;             // per collective: a stalled peer fails it after this
  // A follower waiting for rank 0's next command (LocalComm::wait_command_host) while rank 0 saves
  // a checkpoint or runs the outer sync; 0: no deadline (abort() or a peer's closed socket ends it).
  int64_t command_timeout_ms = 0;
  int64_t rendezvous_timeout_ms = 60000;  // Create: waiting for every process to show up and connect
  std::shared_ptr<CommStore> store;       // required
};

class GlooCommGroup final : public LocalCommGroup {
 public:
  // Connects this process's ranks to every rank of the ring (blocks until
  // every process has called Create, or rendezvous_timeout_ms). Returns an
  // empty string on success, else what went wrong and what to check.
  [[nodiscard]] static std::string Create(const GlooCommOptions& options, std::unique_ptr<GlooCommGroup>* out);
  ~GlooCommGroup() override;
  GlooCommGroup(const GlooCommGroup&) = delete;
  GlooCommGroup& operator=(const GlooCommGroup&) = delete;

  // The whole ring's size (what comm(r)->world_size() says), not this
  // process's share: that is local_ranks().
  int world_size() const override;
  int local_ranks() const;
  int first_rank() const;
  // The comm of global rank first_rank() + local_rank, 0 <= local_rank <
  // local_ranks(); used by one thread; the group must outlive it.
  std::unique_ptr<LocalComm> comm(int local_rank) override;
  // Every pending and later collective of this process's ranks fails with
  // reason within milliseconds (any thread); peers see closed connections.
  void abort(const std::string& reason) override;

  struct State;

 private:
  GlooCommGroup() = default;
  std::unique_ptr<State> state_;
};

}  // namespace diloco
