// The site's local ring over its GPUs through NCCL (kernels/comm/local_comm.h).
// One process drives every GPU of the site, one thread per GPU (the same
// shape as ThreadCommGroup): NcclCommGroup::Create makes one communicator
// per device (ncclCommInitAll); comm(r) is used by the thread of rank r,
// with buffers on devices[r] (e.g. the rank's CudaBackend::grad_buffer()).
//
// Collectives are blocking for the calling thread: they enqueue on the
// comm's own stream and poll it, so that abort() can interrupt them. A dead
// rank, reported by the control plane, is handled by abort(): every rank's
// pending or next collective calls ncclCommAbort on its communicator and
// returns an error at once; the survivors then Create a new group over the
// remaining devices (no waiting out NCCL's timeouts).
//
// A ring across the hosts of a site (CreateAcrossHosts): every host's
// process makes a group of its own GPUs, global ranks first_rank ..
// first_rank + devices.size() - 1 of a ring of world_size ranks. The process
// of global rank 0 draws NCCL's unique id and publishes it in the ring's
// CommStore (the daemons' authenticated control channel, as for Gloo); every
// other process reads it there. Communicators are created non-blocking, so
// forming the ring and every collective have a deadline (timeout_ms): a host
// that never joins, stalls or dies makes the others fail within it (NCCL's
// own error comes sooner when a peer's sockets close) instead of waiting
// forever. NCCL's traffic (its bootstrap and, without InfiniBand, its data)
// is plain TCP on the interface NCCL_SOCKET_IFNAME names: dilocod sets it to
// the ring_address's interface (daemon/util/ring_interface.h).
//
// Only built when NCCL is found (DILOCO_HAVE_NCCL). Never yet run on a GPU
// in this project's CI; scripts/gpu-check.sh runs a 1-rank all-reduce, a
// ring "across hosts" of one process, and a ring whose second host never
// comes (the deadline).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/comm/comm_store.h"
#include "kernels/comm/local_comm.h"

namespace diloco::cuda {

struct NcclOptions {
  // Gradients travel as bf16 (half the bytes; each rank's contribution is
  // rounded to bf16 and the sum is rounded again) instead of fp32.
  bool bf16_all_reduce = false;
};

struct NcclAcrossHostsOptions {
  std::string ring_name;     // names the ring's store keys and its errors; a new ring a new name
  std::vector<int> devices;  // this process's GPUs, in the order of its global ranks
  int world_size = 1;        // ranks of the whole ring, over every host
  int first_rank = 0;        // global rank of devices[0]
  int64_t timeout_ms = 60000;  // forming the ring, and each collective
  // A follower waiting for rank 0's next command (LocalComm::wait_command_host) waits while rank 0
  // saves a checkpoint or runs the outer sync, which may take far longer than a collective: 0
  // waits until abort() or NCCL reports a peer's failure (the control plane aborts a ring whose
  // host died), a positive value bounds the wait.
  int64_t command_timeout_ms = 0;
  std::shared_ptr<CommStore> store;  // required
};

class NcclCommGroup final : public LocalCommGroup {
 public:
  // Returns an empty string on success, else the NCCL/CUDA error and what
  // to check.
  [[nodiscard]] static std::string Create(const std::vector<int>& devices, const NcclOptions& options,
                                          std::unique_ptr<NcclCommGroup>* out);
  // This process's part of a ring across hosts (above): blocks until every
  // host's part has joined, or timeout_ms. Returns "" or what went wrong.
  [[nodiscard]] static std::string CreateAcrossHosts(const NcclAcrossHostsOptions& across, const NcclOptions& options,
                                                     std::unique_ptr<NcclCommGroup>* out);
  ~NcclCommGroup() override;
  NcclCommGroup(const NcclCommGroup&) = delete;
  NcclCommGroup& operator=(const NcclCommGroup&) = delete;

  // The whole ring's size (over every host).
  int world_size() const override;
  // The comm of this process's rank local_rank (device devices[local_rank],
  // global rank first_rank + local_rank); the group must outlive it.
  std::unique_ptr<LocalComm> comm(int local_rank) override;
  // Every pending and later collective fails fast with reason (any thread).
  void abort(const std::string& reason) override;

  struct State;

 private:
  NcclCommGroup() = default;
  std::unique_ptr<State> state_;
};

}  // namespace diloco::cuda
