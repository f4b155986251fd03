// A learner's local ring (DESIGN.md §2): `ranks` ranks, each with its own TrainingBackend on its
// device (kernels/backend.h: CPU threads, or GPUs cuda:N..N+ranks-1) and its LocalComm (threads or
// NCCL). Run() gives every rank a thread; rank 0 runs on the caller's thread and is the one that
// talks to the world (inner_loop.h). ddp in local mode is one ring of learners × ranks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/util/status.h"
#include "kernels/backend.h"

namespace diloco {

class CommStore;  // kernels/comm/gloo_comm.h
class DeviceAllocations;  // kernels/comm/device_check.h

// This host's part of a ring across the hosts of a site (LocalRing::CreateAcrossHosts).
struct RingAcrossHosts {
  int host = 0;               // this host's index: it holds global ranks [host × ranks, (host + 1) × ranks)
  int hosts = 1;              // train.hosts
  std::string ring_name;      // the incarnation: every host of one ring gives the same, a new ring a new one
  std::string ring_address;   // cpu: the address this host's ring binds on (the site's private network)
  int64_t timeout_ms = 60000; // per collective, and for the rendezvous
  std::shared_ptr<CommStore> store;  // the rendezvous (the daemons' ring_set / ring_get)
};

struct LocalRingOptions {
  std::string device = "cpu";  // train.device
  int ranks = 1;
  GptConfig model;
  int batch_size = 1;  // sequences per rank per forward_backward (train.batch_size)
  int threads = 1;     // CPU threads for the whole ring (OpenMP), shared by the ranks
  int hosts = 1;       // train.hosts: Create builds one host's ring (1); CreateAcrossHosts more
  ShardMode shard = ShardMode::kNone;  // train.shard
  bool recompute = false;              // train.recompute
  OuterStatePlace outer_state = OuterStatePlace::kDevice;  // train.outer_state
  // Tests (cpu only): the ring stands in for a GPU ring. Its comms say device memory and refuse
  // any buffer of a device collective that is not a rank's parameters or gradients (what NCCL
  // would fault on), so a host buffer handed to the ring fails on CPU (kernels/comm/device_check.h).
  bool check_device_memory = false;
};

// CRC32C of a backend's parameters: the ranks of a ring must agree bit for bit.
uint32_t ParamsCrc32c(const TrainingBackend& backend);

class LocalRing {
 public:
  // Makes every rank's backend and comm. A device this machine or build lacks is a clear error
  // (no CUDA in this build, no GPU visible, too few GPUs for the ranks).
  static Status Create(const LocalRingOptions& options, std::unique_ptr<LocalRing>* out);
  // This host's options.ranks ranks of a ring of across.hosts × options.ranks ranks: over Gloo on
  // cpu (kernels/comm/gloo_comm.h), over NCCL on cuda:N, this host's GPUs N.. (nccl_comm.h): blocks until every host's part has joined (or
  // across.timeout_ms). options.hosts must be across.hosts. Rank r here is global rank
  // first_rank() + r; a ring whose host dies fails its collectives on every other host.
  static Status CreateAcrossHosts(const LocalRingOptions& options, const RingAcrossHosts& across,
                                  std::unique_ptr<LocalRing>* out);

  // The ranks of the whole ring (over every host) and this host's first one.
  int world_ranks() const { return world_ranks_; }
  int first_rank() const { return first_rank_; }

  int ranks() const { return (int)backends_.size(); }
  const std::string& device() const { return options_.device; }
  // "cpu × 2" or "cuda:0 NVIDIA H200 (...) × 4": for logs and status.
  std::string description() const;
  TrainingBackend& backend(int rank) { return *backends_[rank]; }
  const TrainingBackend& backend(int rank) const { return *backends_[rank]; }
  LocalComm& comm(int rank) { return *comms_[rank]; }
  int threads_per_rank() const { return threads_per_rank_; }

  // Every rank from the same host parameters (and AdamW state, when given; each rank of a
  // sharded ring keeps its part).
  void Upload(const float* params, const AdamWState* optimizer = nullptr);
  // The ring's whole AdamW state: rank 0's, or every rank's part of a sharded ring. Call it while
  // the other ranks wait (in a hook of rank 0), as checkpoints do.
  void DownloadOptimizer(AdamWState* out) const;

  // Runs fn(rank) on one thread per rank (rank 0 on this thread), each with threads_per_rank()
  // OpenMP threads. A rank that fails aborts the ring, so no rank waits forever in a collective.
  // Returns rank 0's status if it failed, else the first failure of another rank.
  Status Run(const std::function<Status(int rank)>& fn);
  // Fails every pending and later collective of this host's ranks (any thread); a ring across
  // hosts fails on the other hosts too.
  void Abort(const std::string& reason) { group_->abort(reason); }

 private:
  LocalRing() = default;
  // A ring of options.ranks backends, global ranks first_rank.. of world; no comms yet.
  static Status MakeBackends(const LocalRingOptions& options, int world, int first_rank, const std::string& what,
                             std::unique_ptr<LocalRing>* out);
  LocalRingOptions options_;
  int threads_per_rank_ = 1;
  int world_ranks_ = 1;  // over every host
  int first_rank_ = 0;
  std::shared_ptr<DeviceAllocations> device_check_;  // options_.check_device_memory
  std::unique_ptr<LocalCommGroup> group_;
  std::vector<std::unique_ptr<TrainingBackend>> backends_;
  std::vector<std::unique_ptr<LocalComm>> comms_;
};

}  // namespace diloco
