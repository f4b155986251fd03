#include "daemon/train/local_ring.h"

#include <omp.h>

#include <thread>

#include "daemon/util/crc32c.h"
#include "kernels/comm/device_check.h"
#include "kernels/comm/device_stand_in.h"

namespace diloco {

uint32_t ParamsCrc32c(const TrainingBackend& backend) {
  std::vector<float> params(backend.num_params());
  backend.download_params(params.data());
  return Crc32c(params.data(), params.size() * sizeof(float));
}

Status LocalRing::MakeBackends(const LocalRingOptions& options, int world, int first_rank, const std::string& what,
                               std::unique_ptr<LocalRing>* out) {
  std::unique_ptr<LocalRing> ring(new LocalRing());
  ring->options_ = options;
  ring->threads_per_rank_ = std::max(1, options.threads / options.ranks);
  ring->world_ranks_ = world;
  ring->first_rank_ = first_rank;
  BackendOptions bo;
  bo.model = options.model;
  bo.max_batch = options.batch_size;
  bo.recompute = options.recompute;
  bo.outer_state = options.outer_state;
  bo.shard = options.shard;
  bo.world = world;
  if (options.check_device_memory) {
    if (options.device != "cpu") return Status::Error(what + "check_device_memory is a test of cpu rings");
    ring->device_check_ = std::make_shared<DeviceAllocations>();
  }
  for (int r = 0; r < options.ranks; r++) {
    bo.rank = first_rank + r;
    std::unique_ptr<TrainingBackend> backend;
    if (std::string err = CreateBackend(RankDevice(options.device, r), bo, &backend); !err.empty())
      return Status::Error(what + "train.device " + options.device + " (rank " + std::to_string(bo.rank) + " of " +
                           std::to_string(world) + "): " + err);
    if (ring->device_check_) backend = StandInForDevice(std::move(backend), ring->device_check_);
    ring->backends_.push_back(std::move(backend));
  }
  *out = std::move(ring);
  return Status::Ok();
}

Status LocalRing::Create(const LocalRingOptions& options, std::unique_ptr<LocalRing>* out) {
  if (options.ranks < 1) return Status::Error("train.ranks must be at least 1, not " + std::to_string(options.ranks));
  if (options.hosts != 1)
    return Status::Error("train.hosts " + std::to_string(options.hosts) +
                         ": a ring across hosts runs in dilocod, on a site of that many hosts (site_hosts in the "
                         "daemon config); here a learner's ring runs on one host (set train.hosts: 1 and use "
                         "train.ranks)");
  std::unique_ptr<LocalRing> ring;
  DL_RETURN_IF_ERROR(MakeBackends(options, options.ranks, 0, "", &ring));
  if (ring->device_check_) {
    ring->group_ = std::make_unique<ThreadCommGroup>(options.ranks, ring->device_check_);
  } else if (std::string err = CreateLocalCommGroup(options.device, options.ranks, &ring->group_); !err.empty())
    return Status::Error("train.device " + options.device + ", train.ranks " + std::to_string(options.ranks) + ": " +
                         err);
  for (int r = 0; r < options.ranks; r++) ring->comms_.push_back(ring->group_->comm(r));
  *out = std::move(ring);
  return Status::Ok();
}

Status LocalRing::CreateAcrossHosts(const LocalRingOptions& options, const RingAcrossHosts& across,
                                    std::unique_ptr<LocalRing>* out) {
  const std::string what = "ring " + across.ring_name + " (host " + std::to_string(across.host) + " of " +
                           std::to_string(across.hosts) + ")";
  if (options.ranks < 1) return Status::Error("train.ranks must be at least 1, not " + std::to_string(options.ranks));
  if (across.hosts < 1 || across.host < 0 || across.host >= across.hosts || options.hosts != across.hosts)
    return Status::Error(what + ": host " + std::to_string(across.host) + " is not among train.hosts " +
                         std::to_string(options.hosts));
  if (!across.store) return Status::Error(what + ": no rendezvous store");
  std::unique_ptr<LocalRing> ring;
  DL_RETURN_IF_ERROR(
      MakeBackends(options, across.hosts * options.ranks, across.host * options.ranks, what + ": ", &ring));
  RingAcrossHostsComm rc;
  rc.ring_name = across.ring_name;
  rc.world_size = ring->world_ranks_;
  rc.first_rank = ring->first_rank_;
  rc.local_ranks = options.ranks;
  rc.address = across.ring_address;
  rc.timeout_ms = across.timeout_ms;
  rc.store = across.store;
  if (std::string err = CreateCommGroupAcrossHosts(options.device, rc, &ring->group_); !err.empty())
    return Status::Error(what + ": " + err);
  for (int r = 0; r < options.ranks; r++) ring->comms_.push_back(ring->group_->comm(r));
  *out = std::move(ring);
  return Status::Ok();
}

std::string LocalRing::description() const {
  std::string d = backends_.front()->name();
  if (world_ranks() > ranks())
    d += " x " + std::to_string(ranks()) + " ranks of " + std::to_string(world_ranks()) + " (" + comms_.front()->name() + ")";
  else if (ranks() > 1) d += " x " + std::to_string(ranks()) + " ranks (" + comms_.front()->name() + ")";
  return d;
}

void LocalRing::Upload(const float* params, const AdamWState* optimizer) {
  for (auto& b : backends_) {
    b->upload_params(params);
    b->upload_optimizer(optimizer ? *optimizer : AdamWState{});
  }
}

void LocalRing::DownloadOptimizer(AdamWState* out) const {
  *out = AdamWState{};
  for (const auto& b : backends_) {
    b->download_optimizer(out);
    if (b->shard() == ShardMode::kNone) return;  // rank 0 holds it all
  }
}

Status LocalRing::Run(const std::function<Status(int rank)>& fn) {
  const int R = ranks();
  std::vector<Status> statuses(R);
  auto run_rank = [&](int r) {
    omp_set_num_threads(threads_per_rank_);
    statuses[r] = fn(r);
    if (!statuses[r].ok()) group_->abort(statuses[r].message());
  };
  const int caller_threads = omp_get_max_threads();
  std::vector<std::thread> threads;
  for (int r = 1; r < R; r++) threads.emplace_back(run_rank, r);
  run_rank(0);
  for (auto& t : threads) t.join();
  omp_set_num_threads(caller_threads);  // rank 0 ran on this thread
  if (!statuses[0].ok()) return statuses[0];
  for (int r = 1; r < R; r++)
    if (!statuses[r].ok()) return statuses[r].WithContext("rank " + std::to_string(r));
  return Status::Ok();
}

}  // namespace diloco
