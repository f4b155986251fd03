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
// Only built when NCCL is found (DILOCO_HAVE_NCCL). Never yet run on a GPU
// in this project's CI; scripts/gpu-check.sh runs a 1-rank all-reduce.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/comm/local_comm.h"

namespace diloco::cuda {

struct NcclOptions {
  // Gradients travel as bf16 (half the bytes; each rank's contribution is
  // rounded to bf16 and the sum is rounded again) instead of fp32.
  bool bf16_all_reduce = false;
};

class NcclCommGroup final : public LocalCommGroup {
 public:
  // Returns an empty string on success, else the NCCL/CUDA error and what
  // to check.
  [[nodiscard]] static std::string Create(const std::vector<int>& devices, const NcclOptions& options,
                                          std::unique_ptr<NcclCommGroup>* out);
  ~NcclCommGroup() override;
  NcclCommGroup(const NcclCommGroup&) = delete;
  NcclCommGroup& operator=(const NcclCommGroup&) = delete;

  int world_size() const override;
  // The comm of rank r (device devices[r]); the group must outlive it.
  std::unique_ptr<LocalComm> comm(int rank) override;
  // Every pending and later collective fails fast with reason (any thread).
  void abort(const std::string& reason) override;

  struct State;

 private:
  NcclCommGroup() = default;
  std::unique_ptr<State> state_;
};

}  // namespace diloco::cuda
