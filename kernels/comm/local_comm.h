// LocalComm: collectives among the ranks of one site's learner (the
// "local ring" of DESIGN.md §3: gradients are all-reduced every inner step).
// Two implementations share this interface so CPU sites, CI and GPU sites
// run the same learner path:
//   ThreadCommGroup (here): ranks are threads of one process, host buffers,
//     a deterministic reduction (always summed in rank order 0, 1, ...).
//   NcclCommGroup (kernels/cuda/nccl_comm.h): ranks are the site's GPUs,
//     device buffers, fp32 or bf16 all-reduce over NCCL.
//   GlooCommGroup (kernels/comm/gloo_comm.h): ranks are processes, possibly
//     on several hosts, over Gloo's TCP transport; the bits of the threads.
// Every rank of a group calls the same collectives in the same order with
// the same sizes; each LocalComm is used by one thread.
//
// Failure: when the control plane reports a dead rank, someone calls the
// group's abort(): every pending and later collective on every rank returns
// an error at once (NCCL: ncclCommAbort) instead of waiting out a timeout.
// The survivors then build a new group.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace diloco {

// A collective's outcome: ok, or why not and what to do next. (kernels/
// cannot use daemon/util/status.h; this is its small local equivalent.)
struct [[nodiscard]] CommStatus {
  std::string error;  // empty: ok
  bool ok() const { return error.empty(); }
  static CommStatus Ok() { return {}; }
  static CommStatus Error(std::string message) { return {std::move(message)}; }
};

enum class ReduceOp { kSum, kMean };

// Where a buffer lives: the comm's collectives take buffers of its backend
// (TrainingBackend::grad_memory()).
enum class MemorySpace { kHost, kDevice };

class LocalComm {
 public:
  virtual ~LocalComm() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual MemorySpace memory() const = 0;
  virtual std::string name() const = 0;  // "threads", "nccl"

  // buf (count floats, memory()) = the sum or mean over the ranks' buffers;
  // every rank ends with the same bits.
  virtual CommStatus all_reduce(float* buf, size_t count, ReduceOp op) = 0;
  // buf (count floats, memory()) = root's buf on every rank.
  virtual CommStatus broadcast(float* buf, size_t count, int root) = 0;
  virtual CommStatus barrier() = 0;
  // values (count doubles in host memory: losses, token counts) = the sum or
  // mean over ranks, the same bits on every rank.
  virtual CommStatus all_reduce_host(double* values, int count, ReduceOp op) = 0;
  // all_reduce_host's sum, for a header from rank 0 that the other ranks wait for between
  // commands (daemon/train/ring_control.h): they wait as long as rank 0 takes to send it (a
  // checkpoint, the outer sync), so a ring whose collectives have a deadline gives this wait its
  // own, long or none (NCCL, Gloo: command_timeout_ms); abort() still ends it.
  virtual CommStatus wait_command_host(double* values, int count) {
    return all_reduce_host(values, count, ReduceOp::kSum);
  }

  // The two halves of an all-reduce, for state sharded over the ranks (ZeRO).
  // buf (memory()) holds parts laid back to back in rank order, part q of
  // counts[q] floats (counts: world_size() entries, 0 allowed, the same on
  // every rank).
  // reduce_scatter: this rank's part of buf = the sum or mean over the ranks
  // of that part; the other parts are left unspecified. Threads and Gloo sum
  // in rank order, so a part gets the bits all_reduce would give it.
  virtual CommStatus reduce_scatter(float* buf, const std::vector<size_t>& counts, ReduceOp op) = 0;
  // all_gather: every part of buf = its owner's part, on every rank.
  virtual CommStatus all_gather(float* buf, const std::vector<size_t>& counts) = 0;

  // reduce_scatter and all_gather ordered on the caller's stream, for a device ring's overlap of
  // its collectives with compute (CudaBackend's sharded step). `stream` is a cudaStream_t passed
  // as void* (kernels/comm knows no CUDA). The collective is enqueued on `stream`, after the
  // work already there, and the call returns without waiting for it: the caller orders its other
  // streams with events, and calls wait_stream before the host relies on what it wrote. Every
  // enqueued collective of the ring must be done (wait_stream) before the ring's blocking
  // collectives run on its own stream. A host ring has no streams: it runs the blocking
  // collective now (the defaults here).
  virtual CommStatus reduce_scatter_on(void* stream, float* buf, const std::vector<size_t>& counts, ReduceOp op) {
    (void)stream;
    return reduce_scatter(buf, counts, op);
  }
  virtual CommStatus all_gather_on(void* stream, float* buf, const std::vector<size_t>& counts) {
    (void)stream;
    return all_gather(buf, counts);
  }
  // Waits on the host for the work enqueued on `stream`, watching abort(), the ring's errors and
  // its deadline as a blocking collective does (a dead peer ends the wait with an error, not a
  // hang). Nothing to wait for on a host ring.
  virtual CommStatus wait_stream(void* stream) {
    (void)stream;
    return CommStatus::Ok();
  }

  // broadcast and all_gather of float buffers in host memory whatever memory() is: for callers
  // whose values are on the host (the sharded outer state's packed fragments and payloads). A
  // device ring stages them through its own device scratch, as all_reduce_host does; a host ring
  // runs its collective in place (the default here).
  virtual CommStatus broadcast_host(float* values, size_t count, int root);
  virtual CommStatus all_gather_host(float* values, const std::vector<size_t>& counts);
};

// Where part `rank` of buffers split by counts begins (the sum of the counts before it).
size_t PartOffset(const std::vector<size_t>& counts, int rank);

// A group of ranks: hands comm(r) to the thread of rank r. The group must
// outlive its comms.
class LocalCommGroup {
 public:
  virtual ~LocalCommGroup() = default;
  virtual int world_size() const = 0;
  // The comm of rank r (0 <= r < world_size).
  virtual std::unique_ptr<LocalComm> comm(int rank) = 0;
  // Fails every pending and later collective of the group with reason (any thread).
  virtual void abort(const std::string& reason) = 0;
};

class DeviceAllocations;  // kernels/comm/device_check.h

// Threads as ranks.
class ThreadCommGroup final : public LocalCommGroup {
 public:
  explicit ThreadCommGroup(int world_size);
  // A ring that stands in for a device ring in CPU tests: its comms say MemorySpace::kDevice and
  // refuse (failing the whole group) any float buffer of a device collective that `device` does
  // not admit, as NCCL would fault on a host buffer; the *_host collectives take host memory.
  ThreadCommGroup(int world_size, std::shared_ptr<DeviceAllocations> device);
  ~ThreadCommGroup() override;
  ThreadCommGroup(const ThreadCommGroup&) = delete;
  ThreadCommGroup& operator=(const ThreadCommGroup&) = delete;

  int world_size() const override;
  std::unique_ptr<LocalComm> comm(int rank) override;
  void abort(const std::string& reason) override;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace diloco
