#include "kernels/cuda/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "kernels/check.h"
#include "kernels/cuda/ops.h"

namespace diloco::cuda {

struct NcclCommGroup::State {
  std::vector<int> devices;  // this process's GPUs
  int world = 0;             // ranks of the whole ring
  int first_rank = 0;        // global rank of devices[0]
  int64_t timeout_ms = 0;    // per collective; 0: none (a ring in one process)
  int64_t command_timeout_ms = 0;  // a follower waiting for rank 0's next command; 0: none
  std::string ring_name;     // a ring across hosts: for errors
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
  NcclComm(NcclCommGroup::State* s, int local) : s_(s), local_(local), rank_(s->first_rank + local) {
    cudaSetDevice(device());
    DL_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreate failed");
  }
  ~NcclComm() override {
    cudaSetDevice(device());
    if (scratch_) cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return s_->world; }
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
    const char* what = "ncclAllReduce (bf16)";
    // A non-blocking communicator (a ring across hosts) may return ncclInProgress: the reduce is
    // on the stream only once NCCL says so, and the conversion back must follow it there.
    if (CommStatus st = enqueued(ncclAllReduce(half, half, count, ncclBfloat16, to_nccl(op), comm(), stream_), what,
                                 s_->timeout_ms);
        !st.ok())
      return st;
    bf16_to_float(buf, half, count, reinterpret_cast<Stream>(stream_));
    return finish(ncclSuccess, what);
  }

  CommStatus broadcast(float* buf, size_t count, int root) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    return finish(ncclBroadcast(buf, buf, count, ncclFloat32, root, comm(), stream_), "ncclBroadcast");
  }

  CommStatus reduce_scatter(float* buf, const std::vector<size_t>& counts, ReduceOp op) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    if (CommStatus st = check_parts("reduce_scatter", counts); !st.ok()) return st;
    return finish(launch_reduce_scatter(buf, counts, op, stream_), reduce_scatter_name(counts));
  }

  CommStatus all_gather(float* buf, const std::vector<size_t>& counts) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    if (CommStatus st = check_parts("all_gather", counts); !st.ok()) return st;
    return finish(launch_all_gather(buf, counts, stream_), all_gather_name(counts));
  }

  // Enqueued on the caller's stream; no host wait here (wait_stream does it, once, for them all).
  CommStatus reduce_scatter_on(void* stream, float* buf, const std::vector<size_t>& counts, ReduceOp op) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    if (CommStatus st = check_parts("reduce_scatter", counts); !st.ok()) return st;
    cudaStream_t on = static_cast<cudaStream_t>(stream);
    return enqueued(launch_reduce_scatter(buf, counts, op, on), reduce_scatter_name(counts), s_->timeout_ms);
  }

  CommStatus all_gather_on(void* stream, float* buf, const std::vector<size_t>& counts) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    if (CommStatus st = check_parts("all_gather", counts); !st.ok()) return st;
    cudaStream_t on = static_cast<cudaStream_t>(stream);
    return enqueued(launch_all_gather(buf, counts, on), all_gather_name(counts), s_->timeout_ms);
  }

  CommStatus wait_stream(void* stream) override {
    if (CommStatus st = enter(); !st.ok()) return st;
    return wait_for(static_cast<cudaStream_t>(stream), "the ring's enqueued collectives", s_->timeout_ms);
  }

  CommStatus barrier() override {
    if (CommStatus st = enter(); !st.ok()) return st;
    float* one = static_cast<float*>(scratch(sizeof(float)));
    return finish(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm(), stream_), "ncclAllReduce (barrier)");
  }

  CommStatus all_reduce_host(double* values, int count, ReduceOp op) override {
    return reduce_host(values, count, op, s_->timeout_ms);
  }

  // A follower waiting here waits for rank 0's next command, however long rank 0 takes to give it
  // (a checkpoint, an outer sync): the deadline is command_timeout_ms, not a collective's.
  CommStatus wait_command_host(double* values, int count) override {
    return reduce_host(values, count, ReduceOp::kSum, s_->command_timeout_ms);
  }

  CommStatus broadcast_host(float* values, size_t count, int root) override {
    return staged(values, count, [&](float* dev) {
      return finish(ncclBroadcast(dev, dev, count, ncclFloat32, root, comm(), stream_), "ncclBroadcast (host values)");
    });
  }

  CommStatus all_gather_host(float* values, const std::vector<size_t>& counts) override {
    if (CommStatus st = check_parts("all_gather_host", counts); !st.ok()) return st;
    size_t total = 0;
    for (size_t c : counts) total += c;
    return staged(values, total, [&](float* dev) { return all_gather(dev, counts); });
  }

 private:
  int device() const { return s_->devices[local_]; }

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
  ncclComm_t comm() const { return s_->comms[local_]; }

  // Equal parts (the padded shards of kernels/shard.h): one ncclReduceScatter. Uneven parts (a
  // ZeRO-2 bucket, which meets the shards where the table puts it; the outer state's pieces): one
  // ncclReduce to each part's owner, grouped; a bucket inside one shard is then a single Reduce.
  ncclResult_t launch_reduce_scatter(float* buf, const std::vector<size_t>& counts, ReduceOp op, cudaStream_t on) {
    if (equal_parts(counts)) {
      float* mine = buf + PartOffset(counts, rank_);
      return ncclReduceScatter(buf, mine, counts[0], ncclFloat32, to_nccl(op), comm(), on);
    }
    ncclResult_t r = ncclGroupStart();
    size_t at = 0;
    for (int q = 0; q < world_size() && (r == ncclSuccess || r == ncclInProgress); q++) {
      if (counts[q]) r = ncclReduce(buf + at, buf + at, counts[q], ncclFloat32, to_nccl(op), q, comm(), on);
      at += counts[q];
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess && r != ncclInProgress ? r : end;
  }
  static const char* reduce_scatter_name(const std::vector<size_t>& counts) {
    return equal_parts(counts) ? "ncclReduceScatter" : "ncclReduce (reduce_scatter)";
  }

  // Equal parts: one ncclAllGather; uneven: one ncclBroadcast from each part's owner, grouped.
  ncclResult_t launch_all_gather(float* buf, const std::vector<size_t>& counts, cudaStream_t on) {
    if (equal_parts(counts)) {
      const float* mine = buf + PartOffset(counts, rank_);
      return ncclAllGather(mine, buf, counts[0], ncclFloat32, comm(), on);
    }
    ncclResult_t r = ncclGroupStart();
    size_t at = 0;
    for (int q = 0; q < world_size() && (r == ncclSuccess || r == ncclInProgress); q++) {
      if (counts[q]) r = ncclBroadcast(buf + at, buf + at, counts[q], ncclFloat32, q, comm(), on);
      at += counts[q];
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess && r != ncclInProgress ? r : end;
  }
  static const char* all_gather_name(const std::vector<size_t>& counts) {
    return equal_parts(counts) ? "ncclAllGather" : "ncclBroadcast (all_gather)";
  }

  // values (host) through the ring's device scratch, an all-reduce with deadline timeout_ms (0: none).
  CommStatus reduce_host(double* values, int count, ReduceOp op, int64_t timeout_ms) {
    if (CommStatus st = enter(); !st.ok()) return st;
    double* dev = static_cast<double*>(scratch(count * sizeof(double)));
    if (cudaMemcpyAsync(dev, values, count * sizeof(double), cudaMemcpyHostToDevice, stream_) != cudaSuccess)
      return CommStatus::Error("cudaMemcpy to the ring's scratch failed");
    CommStatus st = finish(ncclAllReduce(dev, dev, count, ncclFloat64, to_nccl(op), comm(), stream_),
                           "ncclAllReduce (host values)", timeout_ms);
    if (!st.ok()) return st;
    if (cudaMemcpy(values, dev, count * sizeof(double), cudaMemcpyDeviceToHost) != cudaSuccess)
      return CommStatus::Error("cudaMemcpy from the ring's scratch failed");
    return CommStatus::Ok();
  }

  // count host floats copied into the ring's scratch, collective(scratch) run there (it finishes
  // its own collective), and copied back: NCCL reads device memory only.
  template <typename Collective>
  CommStatus staged(float* values, size_t count, Collective&& collective) {
    if (CommStatus st = enter(); !st.ok()) return st;
    float* dev = static_cast<float*>(scratch(std::max<size_t>(count, 1) * sizeof(float)));
    if (count && cudaMemcpyAsync(dev, values, count * sizeof(float), cudaMemcpyHostToDevice, stream_) != cudaSuccess)
      return CommStatus::Error("cudaMemcpy to the ring's scratch failed");
    if (CommStatus st = collective(dev); !st.ok()) return st;
    if (count && cudaMemcpy(values, dev, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
      return CommStatus::Error("cudaMemcpy from the ring's scratch failed");
    return CommStatus::Ok();
  }

  CommStatus enter() {
    cudaSetDevice(device());
    if (s_->aborted.load()) return abort_here();
    return CommStatus::Ok();
  }

  // Aborts this rank's communicator (once) and says why.
  CommStatus abort_here() {
    std::lock_guard<std::mutex> lk(s_->mu);
    if (!s_->comm_aborted[local_]) {
      ncclCommAbort(s_->comms[local_]);
      s_->comm_aborted[local_] = true;
    }
    const std::string ring = s_->ring_name.empty() ? "local ring" : "ring " + s_->ring_name;
    return CommStatus::Error(ring + " aborted at rank " + std::to_string(rank_) + " (" + s_->reason +
                             "): rebuild the ring from the surviving GPUs");
  }

  // Waits for the enqueued collective, watching for abort(), for NCCL's
  // asynchronous errors (a peer failed) and, on a ring across hosts, for its
  // deadline (a peer stalled). A non-blocking communicator (a ring across
  // hosts) may still be enqueuing (ncclInProgress): the stream is only
  // queried once NCCL says the call is done.
  CommStatus finish(ncclResult_t launched, const char* what) { return finish(launched, what, s_->timeout_ms); }
  CommStatus finish(ncclResult_t launched, const char* what, int64_t timeout_ms) {
    if (launched != ncclSuccess && launched != ncclInProgress) return CommStatus::Error(nccl_error(what, launched));
    return wait_for(stream_, what, timeout_ms);
  }

  // Waits for the work on `on` as finish does.
  CommStatus wait_for(cudaStream_t on, const char* what, int64_t timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm(), &async);
      if (async != ncclSuccess && async != ncclInProgress) return fail(nccl_error(what, async));
      if (async == ncclSuccess) {
        const cudaError_t q = cudaStreamQuery(on);
        if (q == cudaSuccess) return CommStatus::Ok();
        if (q != cudaErrorNotReady) return CommStatus::Error(std::string(what) + ": " + cudaGetErrorString(q));
      }
      if (s_->aborted.load()) return abort_here();
      if (timeout_ms > 0 && std::chrono::steady_clock::now() > deadline)
        return fail(std::string(what) + " did not complete within " + std::to_string(timeout_ms) +
                    " ms (a host of the ring stalled or died; raise ring_timeout_ms if its steps are that slow)");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Waits until a launched call is on the stream (a non-blocking communicator's ncclInProgress
  // ends), so that work enqueued after it follows it; abort and the deadline as finish.
  CommStatus enqueued(ncclResult_t launched, const char* what, int64_t timeout_ms) {
    if (launched == ncclSuccess) return CommStatus::Ok();
    if (launched != ncclInProgress) return CommStatus::Error(nccl_error(what, launched));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      ncclResult_t async = ncclInProgress;
      ncclCommGetAsyncError(comm(), &async);
      if (async == ncclSuccess) return CommStatus::Ok();
      if (async != ncclInProgress) return fail(nccl_error(what, async));
      if (s_->aborted.load()) return abort_here();
      if (timeout_ms > 0 && std::chrono::steady_clock::now() > deadline)
        return fail(std::string(what) + " was not enqueued within " + std::to_string(timeout_ms) + " ms");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Aborts the whole group (every rank of this process) for reason.
  CommStatus fail(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      if (s_->reason.empty()) s_->reason = reason;
    }
    s_->aborted.store(true);
    return abort_here();
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
  int local_;  // index into this process's devices and comms
  int rank_;   // global rank
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

// A group's state over this process's devices, global ranks first_rank.. of world; timeout_ms 0: no
// deadline (a ring in one process).
std::unique_ptr<NcclCommGroup::State> new_state(const std::vector<int>& devices, int world, int first_rank,
                                                int64_t timeout_ms, int64_t command_timeout_ms,
                                                const std::string& ring_name, const NcclOptions& options) {
  auto s = std::make_unique<NcclCommGroup::State>();
  s->devices = devices;
  s->world = world;
  s->first_rank = first_rank;
  s->timeout_ms = timeout_ms;
  s->command_timeout_ms = command_timeout_ms;
  s->ring_name = ring_name;
  s->options = options;
  s->comms.assign(devices.size(), nullptr);
  s->comm_aborted.assign(devices.size(), false);
  return s;
}

// "" when every device is a visible GPU, else what is wrong.
std::string check_devices(const std::vector<int>& devices) {
  if (devices.empty()) return "a ring needs at least one GPU";
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return "no CUDA device visible for the NCCL ring (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  }
  for (int d : devices)
    if (d < 0 || d >= count) return "ring device " + std::to_string(d) + " outside the " + std::to_string(count) + " visible";
  return "";
}

constexpr const char* kUniqueIdKey = "/nccl_unique_id";

// NCCL's unique id of the ring: drawn by the process of global rank 0 and published in the store,
// read there by every other process.
std::string exchange_unique_id(const NcclAcrossHostsOptions& o, ncclUniqueId* id) {
  const std::string key = o.ring_name + kUniqueIdKey;
  if (o.first_rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(id); r != ncclSuccess) return nccl_error("ncclGetUniqueId", r);
    const char* bytes = reinterpret_cast<const char*>(id);
    if (CommStatus st = o.store->set(key, std::vector<char>(bytes, bytes + sizeof(*id))); !st.ok())
      return "publishing NCCL's unique id: " + st.error;
    return "";
  }
  std::vector<char> value;
  if (CommStatus st = o.store->get(key, o.timeout_ms, &value); !st.ok())
    return "waiting for NCCL's unique id from the ring's rank 0 (host 0): " + st.error;
  if (value.size() != sizeof(*id))
    return "the ring's store holds a " + std::to_string(value.size()) + "-byte NCCL unique id, not " +
           std::to_string(sizeof(*id)) + " (every host must run the same NCCL version)";
  std::memcpy(id, value.data(), sizeof(*id));
  return "";
}

// Flushes the work of a ring across hosts' non-blocking communicators before ncclCommDestroy: each
// call returns at once, so every rank's finalize runs together; polled for at most timeout_ms.
// Which of them finished.
std::vector<bool> finalize_all(const std::vector<ncclComm_t>& comms, int64_t timeout_ms) {
  std::vector<bool> done(comms.size(), false);
  for (ncclComm_t comm : comms)
    if (comm) ncclCommFinalize(comm);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (size_t i = 0; i < comms.size();) {
    ncclResult_t state = ncclInternalError;
    if (comms[i]) ncclCommGetAsyncError(comms[i], &state);
    if (state != ncclInProgress || std::chrono::steady_clock::now() > deadline) {
      done[i] = state == ncclSuccess;
      i++;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return done;
}

}  // namespace

std::string NcclCommGroup::CreateAcrossHosts(const NcclAcrossHostsOptions& o, const NcclOptions& options,
                                             std::unique_ptr<NcclCommGroup>* out) {
  const int local = (int)o.devices.size();
  const std::string ring = "NCCL ring '" + o.ring_name + "' (ranks " + std::to_string(o.first_rank) + ".." +
                           std::to_string(o.first_rank + local - 1) + " of " + std::to_string(o.world_size) + ")";
  if (!o.store) return ring + ": no store: give a CommStore every host can reach";
  if (o.ring_name.empty()) return "an NCCL ring across hosts needs a ring name";
  if (o.first_rank < 0 || o.first_rank + local > o.world_size || o.timeout_ms < 1)
    return ring + ": ranks outside the ring, or a timeout below 1 ms";
  if (std::string err = check_devices(o.devices); !err.empty()) return ring + ": " + err;
  ncclUniqueId id;
  if (std::string err = exchange_unique_id(o, &id); !err.empty()) return ring + ": " + err;

  std::unique_ptr<NcclCommGroup> g(new NcclCommGroup());
  g->state_ =
      new_state(o.devices, o.world_size, o.first_rank, o.timeout_ms, o.command_timeout_ms, o.ring_name, options);
  State& s = *g->state_;
  // Non-blocking: the init returns at once and is polled below against the deadline; one group
  // call for this process's ranks (one thread inits them all).
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclGroupStart();
  for (int i = 0; i < local && (r == ncclSuccess || r == ncclInProgress); i++) {
    cudaSetDevice(o.devices[i]);
    r = ncclCommInitRankConfig(&s.comms[i], o.world_size, id, o.first_rank + i, &config);
  }
  const ncclResult_t end = ncclGroupEnd();
  std::string err;
  if (r != ncclSuccess && r != ncclInProgress) err = nccl_error("ncclCommInitRankConfig", r);
  if (err.empty() && end != ncclSuccess && end != ncclInProgress) err = nccl_error("ncclGroupEnd (ring init)", end);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.timeout_ms);
  for (int i = 0; i < local && err.empty();) {
    ncclResult_t state = ncclInProgress;
    if (s.comms[i]) ncclCommGetAsyncError(s.comms[i], &state);
    if (state == ncclSuccess) {
      i++;
    } else if (state != ncclInProgress) {
      err = nccl_error("ncclCommInitRankConfig", state);
    } else if (std::chrono::steady_clock::now() > deadline) {
      err = "not every host joined within " + std::to_string(o.timeout_ms) +
            " ms: is dilocod running on each of the site's hosts, and can they reach each other on the "
            "interface NCCL_SOCKET_IFNAME names?";
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (!err.empty()) {
    // The group's destructor aborts what was made.
    s.aborted.store(true);
    return ring + ": " + err;
  }
  *out = std::move(g);
  return "";
}

std::string NcclCommGroup::Create(const std::vector<int>& devices, const NcclOptions& options,
                                  std::unique_ptr<NcclCommGroup>* out) {
  if (std::string err = check_devices(devices); !err.empty()) return err;
  std::unique_ptr<NcclCommGroup> g(new NcclCommGroup());
  g->state_ = new_state(devices, (int)devices.size(), 0, 0, 0, "", options);
  State& s = *g->state_;
  // ncclCommInitAll's own group, written out: its failure inside the group would return with the
  // group still open on this thread, and leave us unable to tell which communicators it made.
  // Here the group is always closed, and what was made is aborted (the destructor) on failure.
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return nccl_error("ncclGetUniqueId", r);
  r = ncclGroupStart();
  for (int i = 0; i < (int)devices.size() && r == ncclSuccess; i++) {
    cudaSetDevice(devices[i]);
    r = ncclCommInitRank(&s.comms[i], (int)devices.size(), id, i);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r != ncclSuccess || end != ncclSuccess) {
    s.aborted.store(true);
    return nccl_error("ncclCommInitRank (ring of one process)", r != ncclSuccess ? r : end);
  }
  *out = std::move(g);
  return "";
}

NcclCommGroup::~NcclCommGroup() {
  if (!state_) return;
  // A ring in one process has blocking communicators: ncclCommDestroy flushes them itself.
  std::vector<bool> flushed(state_->comms.size(), true);
  if (state_->timeout_ms > 0 && !state_->aborted.load()) flushed = finalize_all(state_->comms, state_->timeout_ms);
  for (size_t r = 0; r < state_->comms.size(); r++) {
    if (state_->comm_aborted[r] || !state_->comms[r]) continue;
    if (state_->aborted.load() || !flushed[r]) {
      ncclCommAbort(state_->comms[r]);
    } else {
      ncclCommDestroy(state_->comms[r]);
    }
  }
}

int NcclCommGroup::world_size() const { return state_->world; }

std::unique_ptr<LocalComm> NcclCommGroup::comm(int local_rank) {
  const int local = (int)state_->devices.size();
  DL_CHECK(local_rank >= 0 && local_rank < local, "local rank %d outside [0, %d)", local_rank, local);
  return std::make_unique<NcclComm>(state_.get(), local_rank);
}

void NcclCommGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->reason.empty()) state_->reason = reason;
  }
  state_->aborted.store(true);
}

}  // namespace diloco::cuda
