#include "kernels/comm/gloo_comm.h"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "kernels/check.h"
#include "kernels/comm/deadline.h"

namespace diloco {

namespace {

using namespace comm_deadline;

// gloo::rendezvous::Store over a CommStore, every key under prefix. Gloo wants exceptions.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(CommStore* store, std::string prefix, int64_t timeout_ms)
      : store_(store), prefix_(std::move(prefix)), timeout_ms_(timeout_ms) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const CommStatus st = store_->set(prefix_ + key, data);
    if (!st.ok()) throw gloo::IoException(st.error);
  }

  std::vector<char> get(const std::string& key) override {
    std::vector<char> value;
    const CommStatus st = store_->get(prefix_ + key, timeout_ms_, &value);
    if (!st.ok()) throw gloo::IoException(st.error);
    return value;
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, milliseconds(timeout_ms_)); }

  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    std::vector<char> value;
    for (const std::string& key : keys) {
      const CommStatus st = store_->get(prefix_ + key, std::max<int64_t>(ms_left(deadline), 0), &value);
      if (!st.ok()) throw gloo::IoException(st.error);
    }
  }

 private:
  CommStore* store_;
  std::string prefix_;
  int64_t timeout_ms_;
};

enum class Kind : uint64_t { kAllReduce = 1, kBroadcast, kBarrier, kAllReduceHost, kReduceScatter, kAllGather };

const char* kind_name(uint64_t kind) {
  switch ((Kind)kind) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kBarrier: return "barrier";
    case Kind::kAllReduceHost: return "all_reduce_host";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllGather: return "all_gather";
  }
  return "an unknown collective";
}

// What a rank says it is about to do; every rank must say the same.
struct Signature {
  uint64_t kind = 0;
  uint64_t count = 0;  // values in the buffer
  uint64_t arg = 0;    // ReduceOp, or broadcast's root
  uint64_t split = 0;  // FNV-1a of the part counts (reduce_scatter / all_gather)
  bool operator==(const Signature&) const = default;
};
static_assert(sizeof(Signature) == 32);

std::string describe(const Signature& s) {
  std::string out = std::string(kind_name(s.kind)) + " of " + std::to_string(s.count) + " values";
  if ((Kind)s.kind == Kind::kBroadcast) out += " from root " + std::to_string((int64_t)s.arg);
  if ((Kind)s.kind == Kind::kAllReduce || (Kind)s.kind == Kind::kAllReduceHost ||
      (Kind)s.kind == Kind::kReduceScatter)
    out += (ReduceOp)s.arg == ReduceOp::kMean ? " (mean)" : " (sum)";
  if ((Kind)s.kind == Kind::kReduceScatter || (Kind)s.kind == Kind::kAllGather)
    out += " (split hash " + std::to_string(s.split) + ")";
  return out;
}

uint64_t hash_counts(const std::vector<size_t>& counts) {
  uint64_t h = 1469598103934665603ull;
  for (size_t c : counts) {
    for (int b = 0; b < 8; b++) {
      h ^= (c >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// One point-to-point transfer of an exchange: bytes at offset of the buffer, to or from peer.
struct Transfer {
  int peer;
  size_t offset;
  size_t bytes;
};

}  // namespace

// ---- The group ----

struct GlooCommGroup::State {
  GlooCommOptions options;
  std::shared_ptr<gloo::transport::Device> device;

  // One per local rank; only that rank's thread touches seq and failed.
  struct Rank {
    std::shared_ptr<gloo::rendezvous::Context> context;
    uint64_t seq = 0;    // slot of the next transfer round; the same on every rank
    std::string failed;  // the first transport error: the context is unusable after it
  };
  std::vector<Rank> ranks;

  std::mutex mu;
  std::atomic<bool> aborted{false};
  std::string abort_reason;                                    // under mu
  std::unordered_set<gloo::transport::UnboundBuffer*> waiting;  // buffers of rounds in flight (under mu)

  std::string label(int rank) const {
    return "gloo ring '" + options.ring_name + "' rank " + std::to_string(rank) + "/" +
           std::to_string(options.world_size);
  }
};

namespace {

// Registers a round's buffers so abort() can wake their waits; unregisters them before they die
// (declare it after the buffers).
class WaitRegistration {
 public:
  explicit WaitRegistration(GlooCommGroup::State* s) : s_(s) {}
  ~WaitRegistration() {
    std::lock_guard<std::mutex> lk(s_->mu);
    for (auto* b : buffers_) s_->waiting.erase(b);
  }
  WaitRegistration(const WaitRegistration&) = delete;
  WaitRegistration& operator=(const WaitRegistration&) = delete;
  // False when the group is already aborted (nothing registered then).
  bool add(gloo::transport::UnboundBuffer* a, gloo::transport::UnboundBuffer* b) {
    std::lock_guard<std::mutex> lk(s_->mu);
    if (s_->aborted) return false;
    s_->waiting.insert(a);
    s_->waiting.insert(b);
    buffers_ = {a, b};
    return true;
  }

 private:
  GlooCommGroup::State* s_;
  std::vector<gloo::transport::UnboundBuffer*> buffers_;
};

class GlooComm final : public LocalComm {
 public:
  GlooComm(GlooCommGroup::State* s, int local_rank)
      : s_(s),
        r_(&s->ranks[local_rank]),
        rank_(s->options.first_rank + local_rank),
        world_(s->options.world_size) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  MemorySpace memory() const override { return MemorySpace::kHost; }
  std::string name() const override { return "gloo"; }

  CommStatus all_reduce(float* buf, size_t count, ReduceOp op) override {
    const char* what = "all_reduce";
    const Clock::time_point deadline = start();
    if (CommStatus st = usable(what); !st.ok()) return st;
    if (CommStatus st = agree(what, {(uint64_t)Kind::kAllReduce, count, (uint64_t)op, 0}, deadline); !st.ok())
      return st;
    // The parts of ThreadComm's all_reduce (any split gives the same bits: each value is summed alone).
    const size_t per = (count + world_ - 1) / world_;
    std::vector<size_t> counts(world_);
    for (int q = 0; q < world_; q++) {
      const size_t lo = std::min(count, per * q);
      counts[q] = std::min(count, lo + per) - lo;
    }
    if (CommStatus st = reduce_scatter_data(what, buf, counts, op, deadline); !st.ok()) return st;
    return all_gather_data(what, buf, counts, deadline);
  }

  CommStatus reduce_scatter(float* buf, const std::vector<size_t>& counts, ReduceOp op) override {
    const char* what = "reduce_scatter";
    const Clock::time_point deadline = start();
    if (CommStatus st = usable(what); !st.ok()) return st;
    if (CommStatus st = check_split(what, counts); !st.ok()) return st;
    const Signature sig{(uint64_t)Kind::kReduceScatter, total(counts), (uint64_t)op, hash_counts(counts)};
    if (CommStatus st = agree(what, sig, deadline); !st.ok()) return st;
    return reduce_scatter_data(what, buf, counts, op, deadline);
  }

  CommStatus all_gather(float* buf, const std::vector<size_t>& counts) override {
    const char* what = "all_gather";
    const Clock::time_point deadline = start();
    if (CommStatus st = usable(what); !st.ok()) return st;
    if (CommStatus st = check_split(what, counts); !st.ok()) return st;
    const Signature sig{(uint64_t)Kind::kAllGather, total(counts), 0, hash_counts(counts)};
    if (CommStatus st = agree(what, sig, deadline); !st.ok()) return st;
    return all_gather_data(what, buf, counts, deadline);
  }

  CommStatus broadcast(float* buf, size_t count, int root) override {
    const char* what = "broadcast";
    const Clock::time_point deadline = start();
    if (CommStatus st = usable(what); !st.ok()) return st;
    if (CommStatus st = agree(what, {(uint64_t)Kind::kBroadcast, count, (uint64_t)(int64_t)root, 0}, deadline);
        !st.ok())
      return st;
    if (root < 0 || root >= world_)
      return CommStatus::Error(s_->label(rank_) + ": broadcast from root " + std::to_string(root) +
                               ", outside the ring's ranks [0, " + std::to_string(world_) + ")");
    std::vector<Transfer> sends, recvs;
    const size_t bytes = count * sizeof(float);
    if (bytes) {
      if (rank_ == root) {
        for (int q = 0; q < world_; q++)
          if (q != root) sends.push_back({q, 0, bytes});
      } else {
        recvs.push_back({root, 0, bytes});
      }
    }
    return exchange(what, buf, bytes, sends, buf, bytes, recvs, deadline);
  }

  CommStatus barrier() override {
    const char* what = "barrier";
    const Clock::time_point deadline = start();
    if (CommStatus st = usable(what); !st.ok()) return st;
    return agree(what, {(uint64_t)Kind::kBarrier, 0, 0, 0}, deadline);
  }

  CommStatus all_reduce_host(double* values, int count, ReduceOp op) override {
    return reduce_host("all_reduce_host", values, count, op, start());
  }

  CommStatus wait_command_host(double* values, int count) override {
    // "No deadline" is a week: far past any checkpoint, and still a finite wait for Gloo's clock.
    const int64_t ms = s_->options.command_timeout_ms > 0 ? s_->options.command_timeout_ms : int64_t{7} * 24 * 3600 * 1000;
    return reduce_host("waiting for rank 0's command", values, count, ReduceOp::kSum, Clock::now() + milliseconds(ms));
  }

 private:
  CommStatus reduce_host(const char* what, double* values, int count, ReduceOp op, Clock::time_point deadline) {
    if (CommStatus st = usable(what); !st.ok()) return st;
    if (count < 0)
      return CommStatus::Error(s_->label(rank_) + ": all_reduce_host of " + std::to_string(count) + " values");
    if (CommStatus st = agree(what, {(uint64_t)Kind::kAllReduceHost, (uint64_t)count, (uint64_t)op, 0}, deadline);
        !st.ok())
      return st;
    const size_t n = (size_t)count, bytes = n * sizeof(double);
    host_scratch_.assign((size_t)world_ * n, 0.0);
    if (n) std::memcpy(host_scratch_.data() + (size_t)rank_ * n, values, bytes);
    std::vector<Transfer> sends, recvs;
    if (bytes) {
      for (int q = 0; q < world_; q++) {
        if (q == rank_) continue;
        sends.push_back({q, 0, bytes});
        recvs.push_back({q, (size_t)q * bytes, bytes});
      }
    }
    if (CommStatus st = exchange(what, values, bytes, sends, host_scratch_.data(), (size_t)world_ * bytes, recvs,
                                 deadline);
        !st.ok())
      return st;
    // As ThreadComm: summed in rank order, the mean divides.
    for (size_t i = 0; i < n; i++) {
      double sum = host_scratch_[i];
      for (int q = 1; q < world_; q++) sum += host_scratch_[(size_t)q * n + i];
      values[i] = op == ReduceOp::kMean ? sum / world_ : sum;
    }
    return CommStatus::Ok();
  }

  Clock::time_point start() const { return Clock::now() + milliseconds(s_->options.timeout_ms); }

  static size_t total(const std::vector<size_t>& counts) {
    size_t n = 0;
    for (size_t c : counts) n += c;
    return n;
  }

  CommStatus check_split(const char* what, const std::vector<size_t>& counts) const {
    if ((int)counts.size() == world_) return CommStatus::Ok();
    return CommStatus::Error(s_->label(rank_) + ": " + what + ": " + std::to_string(counts.size()) +
                             " part counts for " + std::to_string(world_) + " ranks");
  }

  CommStatus aborted_status(const char* what) {
    std::lock_guard<std::mutex> lk(s_->mu);
    return CommStatus::Error(s_->label(rank_) + ": " + what + ": local ring aborted (" + s_->abort_reason +
                             "): rebuild the ring from the surviving ranks");
  }

  // Fails at once when the group was aborted or this rank's context broke earlier.
  CommStatus usable(const char* what) {
    if (s_->aborted) return aborted_status(what);
    if (!r_->failed.empty())
      return CommStatus::Error(s_->label(rank_) + ": " + what + ": an earlier collective failed (" + r_->failed +
                               "); this ring cannot be used again: rebuild it from the surviving ranks");
    return CommStatus::Ok();
  }

  // Every rank sends its signature to every rank; all must match rank 0's.
  CommStatus agree(const char* what, Signature mine, Clock::time_point deadline) {
    if (world_ == 1) return CommStatus::Ok();
    std::vector<Signature> all(world_);
    all[rank_] = mine;
    std::vector<Transfer> sends, recvs;
    for (int q = 0; q < world_; q++) {
      if (q == rank_) continue;
      sends.push_back({q, 0, sizeof(Signature)});
      recvs.push_back({q, q * sizeof(Signature), sizeof(Signature)});
    }
    if (CommStatus st = exchange(what, &mine, sizeof(mine), sends, all.data(), all.size() * sizeof(Signature),
                                 recvs, deadline);
        !st.ok())
      return st;
    for (int q = 1; q < world_; q++) {
      if (!(all[q] == all[0]))
        return CommStatus::Error(s_->label(rank_) + ": " + what + ": rank " + std::to_string(q) + " called " +
                                 describe(all[q]) + " and rank 0 " + describe(all[0]) +
                                 "; every rank must call the same collectives with the same sizes and counts");
    }
    return CommStatus::Ok();
  }

  // Each rank sends part q of buf to rank q and sums the R copies of its own part in rank order.
  CommStatus reduce_scatter_data(const char* what, float* buf, const std::vector<size_t>& counts, ReduceOp op,
                                 Clock::time_point deadline) {
    const size_t mine = counts[rank_], at = PartOffset(counts, rank_), n = total(counts);
    scratch_.resize((size_t)world_ * mine);
    std::vector<Transfer> sends, recvs;
    for (int q = 0; q < world_; q++) {
      if (q == rank_) continue;
      if (counts[q]) sends.push_back({q, PartOffset(counts, q) * sizeof(float), counts[q] * sizeof(float)});
      if (mine) recvs.push_back({q, (size_t)q * mine * sizeof(float), mine * sizeof(float)});
    }
    if (CommStatus st = exchange(what, buf, n * sizeof(float), sends, scratch_.data(),
                                 scratch_.size() * sizeof(float), recvs, deadline);
        !st.ok())
      return st;
    std::vector<const float*> src(world_);
    for (int q = 0; q < world_; q++) src[q] = q == rank_ ? buf + at : scratch_.data() + (size_t)q * mine;
    // As ThreadComm: in rank order, the mean multiplies by 1/R.
    const float inv = 1.0f / (float)world_;
    float* out = buf + at;
    for (size_t i = 0; i < mine; i++) {
      float sum = src[0][i];
      for (int q = 1; q < world_; q++) sum += src[q][i];
      out[i] = op == ReduceOp::kMean ? sum * inv : sum;
    }
    return CommStatus::Ok();
  }

  // Each rank sends its part to every rank.
  CommStatus all_gather_data(const char* what, float* buf, const std::vector<size_t>& counts,
                             Clock::time_point deadline) {
    const size_t mine = counts[rank_], at = PartOffset(counts, rank_), bytes = total(counts) * sizeof(float);
    std::vector<Transfer> sends, recvs;
    for (int q = 0; q < world_; q++) {
      if (q == rank_) continue;
      if (mine) sends.push_back({q, at * sizeof(float), mine * sizeof(float)});
      if (counts[q]) recvs.push_back({q, PartOffset(counts, q) * sizeof(float), counts[q] * sizeof(float)});
    }
    return exchange(what, buf, bytes, sends, buf, bytes, recvs, deadline);
  }

  // One round on a fresh slot: posts the receives into recv_ptr and the sends from send_ptr,
  // then waits for all of them by the deadline (or until abort() wakes the waits).
  CommStatus exchange(const char* what, void* send_ptr, size_t send_bytes, const std::vector<Transfer>& sends,
                      void* recv_ptr, size_t recv_bytes, const std::vector<Transfer>& recvs,
                      Clock::time_point deadline) {
    const uint64_t slot = r_->seq++;
    if (sends.empty() && recvs.empty()) return CommStatus::Ok();
    gloo::Context& ctx = *r_->context;
    try {
      std::unique_ptr<gloo::transport::UnboundBuffer> sbuf = ctx.createUnboundBuffer(send_ptr, send_bytes);
      std::unique_ptr<gloo::transport::UnboundBuffer> rbuf = ctx.createUnboundBuffer(recv_ptr, recv_bytes);
      WaitRegistration registration(s_);
      if (!registration.add(sbuf.get(), rbuf.get())) return aborted_status(what);
      for (const Transfer& t : recvs) rbuf->recv(t.peer, slot, t.offset, t.bytes);
      for (const Transfer& t : sends) sbuf->send(t.peer, slot, t.offset, t.bytes);
      for (size_t i = 0; i < recvs.size(); i++)
        if (!rbuf->waitRecv(nullptr, milliseconds(std::max<int64_t>(ms_left(deadline), 1)))) return fail(what, "wait interrupted");
      for (size_t i = 0; i < sends.size(); i++)
        if (!sbuf->waitSend(nullptr, milliseconds(std::max<int64_t>(ms_left(deadline), 1)))) return fail(what, "wait interrupted");
    } catch (const std::exception& e) {
      return fail(what, e.what());
    }
    return CommStatus::Ok();
  }

  // After a failed round the transfers of this context are in an unknown state: close its
  // connections (so no transfer touches our buffers any more, and peers learn at once) and keep
  // failing.
  CommStatus fail(const char* what, const std::string& gloo_error) {
    try {
      r_->context->closeConnections();
    } catch (const std::exception&) {
    }
    if (s_->aborted) {
      r_->failed = "aborted";
      return aborted_status(what);
    }
    r_->failed = s_->label(rank_) + ": " + what + " failed: " + gloo_error;
    return CommStatus::Error(r_->failed + ": a peer process died, stalled for more than timeout_ms (" +
                             std::to_string(s_->options.timeout_ms) +
                             " ms) or became unreachable; abort the ring and rebuild it from the surviving ranks");
  }

  GlooCommGroup::State* s_;
  GlooCommGroup::State::Rank* r_;
  const int rank_;
  const int world_;
  std::vector<float> scratch_;        // reduce_scatter: every rank's copy of this rank's part
  std::vector<double> host_scratch_;  // all_reduce_host: every rank's values
};

}  // namespace

std::string GlooCommGroup::Create(const GlooCommOptions& options, std::unique_ptr<GlooCommGroup>* out) {
  const GlooCommOptions& o = options;
  const std::string ring = "gloo ring '" + o.ring_name + "'";
  if (o.ring_name.empty()) return "gloo ring: ring_name is empty: name the ring (store keys and errors use it)";
  if (o.world_size < 1 || o.local_ranks < 1 || o.first_rank < 0 || o.first_rank + o.local_ranks > o.world_size)
    return ring + ": ranks " + std::to_string(o.first_rank) + ".." + std::to_string(o.first_rank + o.local_ranks - 1) +
           " do not fit a ring of " + std::to_string(o.world_size) +
           ": need world_size >= 1, local_ranks >= 1 and first_rank + local_ranks <= world_size";
  if (o.timeout_ms <= 0 || o.rendezvous_timeout_ms <= 0)
    return ring + ": timeout_ms and rendezvous_timeout_ms must be positive";
  if (!o.store) return ring + ": no store: give a CommStore (e.g. DirectoryCommStore) every process can reach";

  auto state = std::make_unique<State>();
  state->options = o;
  gloo::transport::tcp::attr attr;
  if (!o.interface.empty()) {
    attr.iface = o.interface;
  } else {
    attr.hostname = o.hostname;
  }
  try {
    state->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return ring + ": cannot open a TCP device on " + (o.interface.empty() ? o.hostname : "interface " + o.interface) +
           " (" + e.what() + "): check that the address or interface belongs to this host";
  }

  // Every local rank connects to every rank of the ring at once (each blocks until its peers do).
  GlooStoreAdapter store(o.store.get(), "gloo/" + o.ring_name + "/", o.rendezvous_timeout_ms);
  state->ranks.resize(o.local_ranks);
  std::vector<std::string> errors(o.local_ranks);
  std::vector<std::thread> threads;
  for (int l = 0; l < o.local_ranks; l++) {
    threads.emplace_back([&, l] {
      const int rank = o.first_rank + l;
      try {
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, o.world_size);
        context->setTimeout(milliseconds(o.rendezvous_timeout_ms));
        context->connectFullMesh(store, state->device);
        context->setTimeout(milliseconds(o.timeout_ms));
        state->ranks[l].context = std::move(context);
      } catch (const std::exception& e) {
        errors[l] = state->label(rank) + ": cannot connect to the other ranks within " +
                    std::to_string(o.rendezvous_timeout_ms) + " ms (" + e.what() +
                    "): check that every process of the ring started with the same ring name and store, and "
                    "that the hosts reach each other";
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) return e;
  out->reset(new GlooCommGroup());
  (*out)->state_ = std::move(state);
  return "";
}

GlooCommGroup::~GlooCommGroup() = default;

int GlooCommGroup::world_size() const { return state_->options.world_size; }
int GlooCommGroup::local_ranks() const { return state_->options.local_ranks; }
int GlooCommGroup::first_rank() const { return state_->options.first_rank; }

std::unique_ptr<LocalComm> GlooCommGroup::comm(int local_rank) {
  DL_CHECK(local_rank >= 0 && local_rank < local_ranks(), "local rank %d outside [0, %d)", local_rank,
           local_ranks());
  return std::make_unique<GlooComm>(state_.get(), local_rank);
}

void GlooCommGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->aborted) return;
    state_->abort_reason = reason;
    state_->aborted = true;  // no round registers after this
  }
  // Close first: once a pair is closed Gloo's event loop no longer touches its transfers, so the
  // rounds woken below may free their buffers. Peers see the connections drop.
  for (State::Rank& r : state_->ranks) {
    try {
      r.context->closeConnections();
    } catch (const std::exception&) {
    }
  }
  std::lock_guard<std::mutex> lk(state_->mu);
  for (gloo::transport::UnboundBuffer* b : state_->waiting) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

}  // namespace diloco
