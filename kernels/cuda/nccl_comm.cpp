#include "kernels/cuda/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "kernels/check.h"
#include "kernels/cuda/ops.h"

namespace diloco::cuda {

struct NcclCommGroup::State {
  std::vector<int> devices;
  NcclOptions options;
  std::vector<ncclComm_t> comms;
  std::vector<bool> comm_aborted;  // guarded by mu
  std::mutex mu;
  std::atomic<bool> aborted{false};
  std::string reason;  // guarded by mu
};

namespace {

std::string nccl_error(const char* what, ncclResult_t r) {
  return std::string(what) + " failed: " + ncclGetErrorString(r) +
         " (check the GPUs with nvidia-smi and NCCL_DEBUG=WARN for details)";
}

ncclRedOp_t to_nccl(ReduceOp op) { return op == ReduceOp::kMean ? ncclAvg : ncclSum; }

class NcclComm final : public LocalComm {
 public:
  NcclComm(NcclCommGroup::State* s, int rank) : s_(s), rank_(rank) {
    cudaSetDevice(device());
    DL_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreate failed");
  }
  ~NcclComm() override {
    cudaSetDevice(device());
    if (scratch_) cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return (int)s_->devices.size(); }
  MemorySpace memory() const override { return MemorySpace::kDevice; }
  std::string name() const override { return "nccl"; }

  CommStatus all_reduce(float* buf, size_t count, ReduceOp op) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    if (!s_->options.bf16_all_reduce) {
      return finish(ncclAllReduce(buf, buf, count, ncclFloat32, to_nccl(op), comm(), stream_), "ncclAllReduce");
    }
    // bf16 on the wire: convert, reduce, convert back (all on this stream).
    bf16* half = static_cast<bf16*>(scratch(count * sizeof(bf16)));
    float_to_bf16(half, buf, count, reinterpret_cast<Stream>(stream_));
    const ncclResult_t r = ncclAllReduce(half, half, count, ncclBfloat16, to_nccl(op), comm(), stream_);
    if (r == ncclSuccess) bf16_to_float(buf, half, count, reinterpret_cast<Stream>(stream_));
    return finish(r, "ncclAllReduce (bf16)");
  }

  CommStatus broadcast(float* buf, size_t count, int root) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    return finish(ncclBroadcast(buf, buf, count, ncclFloat32, root, comm(), stream_), "ncclBroadcast");
  }

  CommStatus reduce_scatter(float* buf, const std::vector<size_t>& counts, ReduceOp op) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    if (CommStatus st = check_parts("reduce_scatter", counts); !st.ok()) return st;
    if (equal_parts(counts)) {
      float* mine = buf + PartOffset(counts, rank_);
      return finish(ncclReduceScatter(buf, mine, counts[0], ncclFloat32, to_nccl(op), comm(), stream_),
                    "ncclReduceScatter");
    }
    // Uneven parts (a bucket that straddles shard edges): one reduce to each part's owner.
    ncclResult_t r = ncclGroupStart();
    size_t at = 0;
    for (int q = 0; q < world_size() && r == ncclSuccess; q++) {
      if (counts[q]) r = ncclReduce(buf + at, buf + at, counts[q], ncclFloat32, to_nccl(op), q, comm(), stream_);
      at += counts[q];
    }
    const ncclResult_t end = ncclGroupEnd();
    return finish(r != ncclSuccess ? r : end, "ncclReduce (reduce_scatter)");
  }

  CommStatus all_gather(float* buf, const std::vector<size_t>& counts) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    if (CommStatus st = check_parts("all_gather", counts); !st.ok()) return st;
    if (equal_parts(counts)) {
      const float* mine = buf + PartOffset(counts, rank_);
      return finish(ncclAllGather(mine, buf, counts[0], ncclFloat32, comm(), stream_), "ncclAllGather");
    }
    ncclResult_t r = ncclGroupStart();
    size_t at = 0;
    for (int q = 0; q < world_size() && r == ncclSuccess; q++) {
      if (counts[q]) r = ncclBroadcast(buf + at, buf + at, counts[q], ncclFloat32, q, comm(), stream_);
      at += counts[q];
    }
    const ncclResult_t end = ncclGroupEnd();
    return finish(r != ncclSuccess ? r : end, "ncclBroadcast (all_gather)");
  }

  CommStatus barrier() override {
    if (CommStatus st = enter(); !st.ok()) return st;
    float* one = static_cast<float*>(scratch(sizeof(float)));
    return finish(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm(), stream_), "ncclAllReduce (barrier)");
  }

  CommStatus all_reduce_host(double* values, int count, ReduceOp op) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    double* dev = static_cast<double*>(scratch(count * sizeof(double)));
    if (cudaMemcpyAsync(dev, values, count * sizeof(double), cudaMemcpyHostToDevice, stream_) != cudaSuccess)
      return CommStatus::Error("cudaMemcpy to the ring's scratch failed");
    CommStatus st = finish(ncclAllReduce(dev, dev, count, ncclFloat64, to_nccl(op), comm(), stream_),
                           "ncclAllReduce (host values)");
    if (!st.ok()) return st;
    if (cudaMemcpy(values, dev, count * sizeof(double), cudaMemcpyDeviceToHost) != cudaSuccess)
      return CommStatus::Error("cudaMemcpy from the ring's scratch failed");
    return CommStatus::Ok();
  }

 private:
  int device() const { return s_->devices[rank_]; }

  CommStatus check_parts(const char* what, const std::vector<size_t>& counts) const {
    if ((int)counts.size() == world_size()) return CommStatus::Ok();
    return CommStatus::Error(std::string(what) + ": " + std::to_string(counts.size()) + " part counts for " +
                             std::to_string(world_size()) + " ranks");
  }
  static bool equal_parts(const std::vector<size_t>& counts) {
    for (size_t c : counts)
      if (c != counts[0]) return false;
    return counts[0] > 0;
  }
  ncclComm_t comm() const { return s_->comms[rank_]; }

  CommStatus enter() {
    cudaSetDevice(device());
    if (s_->aborted.load()) return abort_here();
    return CommStatus::Ok();
  }

  // Aborts this rank's communicator (once) and says why.
  CommStatus abort_here() {
    std::lock_guard<std::mutex> lk(s_->mu);
    if (!s_->comm_aborted[rank_]) {
      ncclCommAbort(s_->comms[rank_]);
      s_->comm_aborted[rank_] = true;
    }
    return CommStatus::Error("local ring aborted (" + s_->reason + "): rebuild the ring from the surviving GPUs");
  }

  // Waits for the enqueued collective, watching for abort() and for NCCL's
  // asynchronous errors (a peer failed).
  CommStatus finish(ncclResult_t launched, const char* what) {
    if (launched != ncclSuccess && launched != ncclInProgress) return CommStatus::Error(nccl_error(what, launched));
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return CommStatus::Ok();
      if (q != cudaErrorNotReady) return CommStatus::Error(std::string(what) + ": " + cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm(), &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        {
          std::lock_guard<std::mutex> lk(s_->mu);
          if (s_->reason.empty()) s_->reason = nccl_error(what, async);
        }
        s_->aborted.store(true);
        return abort_here();
      }
      if (s_->aborted.load()) return abort_here();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_) cudaFree(scratch_);
      DL_CHECK(cudaMalloc(&scratch_, bytes) == cudaSuccess, "cudaMalloc of %zu bytes for the ring failed", bytes);
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  NcclCommGroup::State* s_;
  int rank_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::string NcclCommGroup::Create(const std::vector<int>& devices, const NcclOptions& options,
                                  std::unique_ptr<NcclCommGroup>* out) {
  if (devices.empty()) return "a ring needs at least one GPU";
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return "no CUDA device visible for the NCCL ring (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  }
  for (int d : devices)
    if (d < 0 || d >= count) return "ring device " + std::to_string(d) + " outside the " + std::to_string(count) + " visible";
  std::unique_ptr<NcclCommGroup> g(new NcclCommGroup());
  g->state_ = std::make_unique<State>();
  State& s = *g->state_;
  s.devices = devices;
  s.options = options;
  s.comms.resize(devices.size());
  s.comm_aborted.assign(devices.size(), false);
  const ncclResult_t r = ncclCommInitAll(s.comms.data(), (int)devices.size(), devices.data());
  if (r != ncclSuccess) return nccl_error("ncclCommInitAll", r);
  *out = std::move(g);
  return "";
}

NcclCommGroup::~NcclCommGroup() {
  if (!state_) return;
  for (size_t r = 0; r < state_->comms.size(); r++) {
    if (state_->comm_aborted[r]) continue;
    if (state_->aborted.load()) {
      ncclCommAbort(state_->comms[r]);
    } else {
      ncclCommDestroy(state_->comms[r]);
    }
  }
}

int NcclCommGroup::world_size() const { return (int)state_->devices.size(); }

std::unique_ptr<LocalComm> NcclCommGroup::comm(int rank) {
  DL_CHECK(rank >= 0 && rank < world_size(), "rank %d outside [0, %d)", rank, world_size());
  return std::make_unique<NcclComm>(state_.get(), rank);
}

void NcclCommGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->reason.empty()) state_->reason = reason;
  }
  state_->aborted.store(true);
}

}  // namespace diloco::cuda
