// CreateBackend: picks the backend by name. Its own library
// (diloco_backend) so that diloco_kernels does not depend on the CUDA
// backend, which depends on diloco_kernels.
#include <cstdlib>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef DILOCO_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#endif
#ifdef DILOCO_HAVE_NCCL
#include "kernels/cuda/nccl_comm.h"
#endif
#ifdef DILOCO_HAVE_GLOO
#include "kernels/comm/gloo_comm.h"
#endif

namespace diloco {

bool BackendCompiled(const std::string& kind) {
  if (kind == "cpu") return true;
#ifdef DILOCO_HAVE_CUDA
  if (kind == "cuda") return true;
#endif
  return false;
}

namespace {

// The N of "cuda" / "cuda:N"; -1 when device is not spelled so.
int CudaIndex(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5) return -1;
  char* end = nullptr;
  const long v = std::strtol(device.c_str() + 5, &end, 10);
  if (*end != '\0' || v < 0 || v > 99999) return -1;  // a device count check names the real range
  return (int)v;
}

// A ring of one rank on a device, for builds without NCCL: every collective
// is the identity (one rank's mean is its own buffer).
class SoloComm final : public LocalComm {
 public:
  explicit SoloComm(MemorySpace memory) : memory_(memory) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  MemorySpace memory() const override { return memory_; }
  std::string name() const override { return "solo"; }
  CommStatus all_reduce(float*, size_t, ReduceOp) override { return CommStatus::Ok(); }
  CommStatus broadcast(float*, size_t, int) override { return CommStatus::Ok(); }
  CommStatus barrier() override { return CommStatus::Ok(); }
  CommStatus all_reduce_host(double*, int, ReduceOp) override { return CommStatus::Ok(); }
  CommStatus reduce_scatter(float*, const std::vector<size_t>&, ReduceOp) override { return CommStatus::Ok(); }
  CommStatus all_gather(float*, const std::vector<size_t>&) override { return CommStatus::Ok(); }
  CommStatus broadcast_host(float*, size_t, int) override { return CommStatus::Ok(); }
  CommStatus all_gather_host(float*, const std::vector<size_t>&) override { return CommStatus::Ok(); }

 private:
  MemorySpace memory_;
};

class SoloCommGroup final : public LocalCommGroup {
 public:
  explicit SoloCommGroup(MemorySpace memory) : memory_(memory) {}
  int world_size() const override { return 1; }
  std::unique_ptr<LocalComm> comm(int) override { return std::make_unique<SoloComm>(memory_); }
  void abort(const std::string&) override {}

 private:
  MemorySpace memory_;
};

}  // namespace

std::string RankDevice(const std::string& device, int rank) {
  const int first = CudaIndex(device);
  return first < 0 ? device : "cuda:" + std::to_string(first + rank);
}

std::string CheckDeviceAvailable(const std::string& device, int ranks) {
  if (ranks < 1) return "a local ring needs at least 1 rank, not " + std::to_string(ranks);
  if (device == "cpu") return "";
  const int first = CudaIndex(device);
  if (first < 0) return "unknown device \"" + device + "\": use cpu, cuda or cuda:N";
#ifdef DILOCO_HAVE_CUDA
  const int count = cuda::device_count();
  if (count == 0)
    return "no CUDA device is visible (check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES), or train on the cpu "
           "(train.device: cpu)";
  if (first + ranks > count)
    return std::to_string(ranks) + " rank(s) from cuda:" + std::to_string(first) + " need " +
           std::to_string(first + ranks) + " GPU(s); " + std::to_string(count) + " visible (cuda:0.." +
           std::to_string(count - 1) + ")";
#ifndef DILOCO_HAVE_NCCL
  if (ranks > 1) return "this build has no NCCL ring for several GPUs: install NCCL (libnccl-dev) and rebuild";
#endif
  return "";
#else
  return "this build has no CUDA backend; rebuild with the CUDA toolkit installed (cmake -DDILOCO_CUDA=ON) or "
         "train on the cpu (train.device: cpu)";
#endif
}

std::string CreateLocalCommGroup(const std::string& device, int ranks, std::unique_ptr<LocalCommGroup>* out) {
  if (ranks < 1) return "a local ring needs at least 1 rank, not " + std::to_string(ranks);
  if (device == "cpu") {
    *out = std::make_unique<ThreadCommGroup>(ranks);
    return "";
  }
  const int first = CudaIndex(device);
  if (first < 0) return "unknown device \"" + device + "\": use cpu, cuda or cuda:N";
#ifdef DILOCO_HAVE_NCCL
  std::vector<int> devices;
  for (int r = 0; r < ranks; r++) devices.push_back(first + r);
  std::unique_ptr<cuda::NcclCommGroup> group;
  if (std::string err = cuda::NcclCommGroup::Create(devices, {}, &group); !err.empty()) return err;
  *out = std::move(group);
  return "";
#else
  if (ranks == 1) {
    *out = std::make_unique<SoloCommGroup>(MemorySpace::kDevice);
    return "";
  }
  return "device \"" + device + "\" with " + std::to_string(ranks) +
         " rank(s): this build has no NCCL ring; install NCCL (libnccl-dev) and rebuild with the CUDA toolkit";
#endif
}

std::string CreateCommGroupAcrossHosts(const std::string& device, const RingAcrossHostsComm& ring,
                                       std::unique_ptr<LocalCommGroup>* out) {
  if (ring.local_ranks < 1) return "a ring needs at least 1 rank on each host, not " + std::to_string(ring.local_ranks);
  if (device == "cpu") {
#ifdef DILOCO_HAVE_GLOO
    GlooCommOptions go;
    go.ring_name = ring.ring_name;
    go.world_size = ring.world_size;
    go.first_rank = ring.first_rank;
    go.local_ranks = ring.local_ranks;
    go.hostname = ring.address;
    go.timeout_ms = ring.timeout_ms;
    go.rendezvous_timeout_ms = ring.timeout_ms;
    go.store = ring.store;
    std::unique_ptr<GlooCommGroup> group;
    if (std::string err = GlooCommGroup::Create(go, &group); !err.empty()) return err;
    *out = std::move(group);
    return "";
#else
    return "this build has no Gloo, which a CPU ring across hosts runs on: install libgloo-dev and rebuild";
#endif
  }
  const int first = CudaIndex(device);
  if (first < 0) return "unknown device \"" + device + "\": use cpu, cuda or cuda:N";
#ifdef DILOCO_HAVE_NCCL
  cuda::NcclAcrossHostsOptions na;
  na.ring_name = ring.ring_name;
  for (int r = 0; r < ring.local_ranks; r++) na.devices.push_back(first + r);
  na.world_size = ring.world_size;
  na.first_rank = ring.first_rank;
  na.timeout_ms = ring.timeout_ms;
  na.store = ring.store;
  std::unique_ptr<cuda::NcclCommGroup> group;
  if (std::string err = cuda::NcclCommGroup::CreateAcrossHosts(na, {}, &group); !err.empty()) return err;
  *out = std::move(group);
  return "";
#else
  return "device \"" + device + "\": this build has no NCCL, which a GPU ring across hosts runs on; install NCCL "
         "(libnccl-dev) and rebuild with the CUDA toolkit";
#endif
}

std::string CreateBackend(const std::string& device, const BackendOptions& options,
                          std::unique_ptr<TrainingBackend>* out) {
  const GptConfig& m = options.model;
  if (m.vocab_size < 1 || m.block_size < 1 || m.n_layer < 0 || m.n_embd < 1 || m.n_head < 1 ||
      m.n_embd % m.n_head != 0 || options.max_batch < 1) {
    return "invalid model for a backend (vocab " + std::to_string(m.vocab_size) + ", block " +
           std::to_string(m.block_size) + ", n_embd " + std::to_string(m.n_embd) + ", n_head " +
           std::to_string(m.n_head) + ", max_batch " + std::to_string(options.max_batch) +
           "): n_embd must be a multiple of n_head and every size positive";
  }
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world)
    return "rank " + std::to_string(options.rank) + " of a ring of " + std::to_string(options.world);
  if (device == "cpu") {
    *out = std::make_unique<CpuBackend>(options);
    return "";
  }
  if (const int index = CudaIndex(device); index >= 0) {
    // Not compiled, no GPU, index out of range: CheckDeviceAvailable says which, and what to do.
    if (std::string err = CheckDeviceAvailable(device, 1); !err.empty()) return "device \"" + device + "\": " + err;
#ifdef DILOCO_HAVE_CUDA
    return cuda::CreateCudaBackend(index, options, out);
#endif
  }
  if (device.rfind("cuda", 0) == 0) return "bad device \"" + device + "\": use cuda or cuda:N";
  return "unknown device \"" + device + "\": use cpu, cuda or cuda:N";
}

}  // namespace diloco
