#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "kernels/check.h"
#include "kernels/comm/device_check.h"
#include "kernels/comm/local_comm.h"

namespace diloco {

// Shared by the ranks of a group. Collectives are phases separated by a
// barrier; the last rank to arrive runs the phase's completion step.
struct ThreadCommGroup::State {
  explicit State(int n) : world(n), ptrs(n), host_ptrs(n), counts(n), roots(n), parts(n) {}

  const int world;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string abort_reason;

  // What each rank posted for the current collective.
  std::vector<float*> ptrs;
  std::vector<double*> host_ptrs;
  std::vector<size_t> counts;
  std::vector<int> roots;
  std::vector<const std::vector<size_t>*> parts;  // reduce_scatter / all_gather splits
  std::string phase_error;  // set by a completion step, read by every rank
  std::vector<float> scratch;
  // Set in the checking mode (ThreadCommGroup's second constructor): what counts as device memory.
  std::shared_ptr<DeviceAllocations> device;

  // Waits for every rank; completion (under the lock) runs once, by the
  // last to arrive. False when the group was aborted.
  bool arrive_and_wait(const std::function<void()>& completion = {}) {
    std::unique_lock<std::mutex> lk(mu);
    if (aborted) return false;
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      if (completion) completion();
      generation++;
      cv.notify_all();
      return true;
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    return generation != gen;
  }

  CommStatus aborted_status() {
    std::lock_guard<std::mutex> lk(mu);
    return CommStatus::Error("local ring aborted (" + abort_reason +
                             "): rebuild the ring from the surviving ranks");
  }
};

namespace {

class ThreadComm final : public LocalComm {
 public:
  ThreadComm(ThreadCommGroup::State* s, int rank) : s_(s), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return s_->world; }
  MemorySpace memory() const override { return s_->device ? MemorySpace::kDevice : MemorySpace::kHost; }
  std::string name() const override { return s_->device ? "threads (device memory checked)" : "threads"; }

  CommStatus all_reduce(float* buf, size_t count, ReduceOp op) override {
    if (CommStatus st = admit("all_reduce", buf, count); !st.ok()) return st;
    s_->ptrs[rank_] = buf;
    s_->counts[rank_] = count;
    s_->roots[rank_] = -1;
    if (!s_->arrive_and_wait([this] { check_counts("all_reduce", /*resize_scratch=*/true); }))
      return s_->aborted_status();
    if (!s_->phase_error.empty()) return CommStatus::Error(s_->phase_error);
    // Rank r sums its slice of every buffer, in rank order, into scratch.
    const int R = s_->world;
    const size_t per = (count + R - 1) / R;
    const size_t lo = std::min(count, per * rank_), hi = std::min(count, lo + per);
    const float inv = 1.0f / (float)R;
    for (size_t i = lo; i < hi; i++) {
      float sum = s_->ptrs[0][i];
      for (int q = 1; q < R; q++) sum += s_->ptrs[q][i];
      s_->scratch[i] = op == ReduceOp::kMean ? sum * inv : sum;
    }
    if (!s_->arrive_and_wait()) return s_->aborted_status();
    // Nobody reads the posted buffers any more: copy the result out. The
    // next collective's first barrier waits for every copy to finish.
    if (count) std::memcpy(buf, s_->scratch.data(), count * sizeof(float));
    return CommStatus::Ok();
  }

  CommStatus broadcast(float* buf, size_t count, int root) override {
    if (CommStatus st = admit("broadcast", buf, count); !st.ok()) return st;
    return broadcast_host(buf, count, root);
  }

  CommStatus broadcast_host(float* buf, size_t count, int root) override {
    s_->ptrs[rank_] = buf;
    s_->counts[rank_] = count;
    s_->roots[rank_] = root;
    if (!s_->arrive_and_wait([this] { check_counts("broadcast", false); })) return s_->aborted_status();
    if (!s_->phase_error.empty()) return CommStatus::Error(s_->phase_error);
    if (rank_ != root && count) std::memcpy(buf, s_->ptrs[root], count * sizeof(float));
    // The root's buffer must stay as it is until everyone copied.
    if (!s_->arrive_and_wait()) return s_->aborted_status();
    return CommStatus::Ok();
  }

  CommStatus reduce_scatter(float* buf, const std::vector<size_t>& counts, ReduceOp op) override {
    if (CommStatus st = admit("reduce_scatter", buf, PartOffset(counts, (int)counts.size())); !st.ok()) return st;
    if (CommStatus st = post_parts("reduce_scatter", buf, counts); !st.ok()) return st;
    // This rank's part, summed in rank order in place: no other rank reads it (each reads its own
    // part of every buffer), and every value is read before it is written.
    const size_t lo = PartOffset(counts, rank_), hi = lo + counts[rank_];
    const int R = s_->world;
    const float inv = 1.0f / (float)R;
    for (size_t i = lo; i < hi; i++) {
      float sum = s_->ptrs[0][i];
      for (int q = 1; q < R; q++) sum += s_->ptrs[q][i];
      buf[i] = op == ReduceOp::kMean ? sum * inv : sum;
    }
    // Others may still read our other parts.
    if (!s_->arrive_and_wait()) return s_->aborted_status();
    return CommStatus::Ok();
  }

  CommStatus all_gather(float* buf, const std::vector<size_t>& counts) override {
    if (CommStatus st = admit("all_gather", buf, PartOffset(counts, (int)counts.size())); !st.ok()) return st;
    return all_gather_host(buf, counts);
  }

  CommStatus all_gather_host(float* buf, const std::vector<size_t>& counts) override {
    if (CommStatus st = post_parts("all_gather", buf, counts); !st.ok()) return st;
    size_t at = 0;
    for (int q = 0; q < s_->world; q++) {
      if (q != rank_ && counts[q]) std::memcpy(buf + at, s_->ptrs[q] + at, counts[q] * sizeof(float));
      at += counts[q];
    }
    // Our part must stay as it is until everyone copied it.
    if (!s_->arrive_and_wait()) return s_->aborted_status();
    return CommStatus::Ok();
  }

  CommStatus barrier() override {
    if (!s_->arrive_and_wait()) return s_->aborted_status();
    return CommStatus::Ok();
  }

  CommStatus all_reduce_host(double* values, int count, ReduceOp op) override {
    s_->host_ptrs[rank_] = values;
    s_->counts[rank_] = (size_t)count;
    s_->roots[rank_] = -1;
    if (!s_->arrive_and_wait([this] { check_counts("all_reduce_host", false); })) return s_->aborted_status();
    if (!s_->phase_error.empty()) return CommStatus::Error(s_->phase_error);
    std::vector<double> result(count);
    for (int i = 0; i < count; i++) {
      double sum = s_->host_ptrs[0][i];
      for (int q = 1; q < s_->world; q++) sum += s_->host_ptrs[q][i];
      result[i] = op == ReduceOp::kMean ? sum / s_->world : sum;
    }
    if (!s_->arrive_and_wait()) return s_->aborted_status();  // everyone has read every input
    std::memcpy(values, result.data(), count * sizeof(double));
    return CommStatus::Ok();
  }

 private:
  // In the checking mode, a device collective's buffer must be declared device memory; a refused
  // one fails the whole group at once, so the other ranks do not wait for this one.
  CommStatus admit(const char* what, const float* buf, size_t count) {
    if (!s_->device || count == 0 || s_->device->Admits(buf, count * sizeof(float))) return CommStatus::Ok();
    const std::string error = std::string(what) + " on rank " + std::to_string(rank_) +
                              " got a buffer that is not device memory (a host buffer on a GPU ring: NCCL "
                              "would fault); stage host values through the *_host collectives";
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      if (!s_->aborted) {
        s_->aborted = true;
        s_->abort_reason = error;
      }
      s_->cv.notify_all();
    }
    return CommStatus::Error(error);
  }

  // Posts buf and its split, waits for every rank and checks that all passed the same split.
  CommStatus post_parts(const char* what, float* buf, const std::vector<size_t>& counts) {
    if ((int)counts.size() != s_->world)
      return CommStatus::Error(std::string(what) + ": " + std::to_string(counts.size()) + " part counts for " +
                               std::to_string(s_->world) + " ranks");
    s_->ptrs[rank_] = buf;
    s_->parts[rank_] = &counts;
    size_t total = 0;
    for (size_t c : counts) total += c;
    s_->counts[rank_] = total;
    s_->roots[rank_] = -1;
    if (!s_->arrive_and_wait([this, what] {
          check_counts(what, false);
          for (int q = 1; q < s_->world && s_->phase_error.empty(); q++)
            if (*s_->parts[q] != *s_->parts[0])
              s_->phase_error = std::string(what) + ": rank " + std::to_string(q) +
                                " split the buffer unlike rank 0; every rank must pass the same counts";
        }))
      return s_->aborted_status();
    if (!s_->phase_error.empty()) return CommStatus::Error(s_->phase_error);
    return CommStatus::Ok();
  }

  // Completion step: all ranks must agree on sizes (and roots).
  void check_counts(const char* what, bool resize_scratch) {
    s_->phase_error.clear();
    for (int q = 1; q < s_->world; q++) {
      if (s_->counts[q] != s_->counts[0] || s_->roots[q] != s_->roots[0]) {
        s_->phase_error = std::string(what) + ": rank " + std::to_string(q) + " passed " +
                          std::to_string(s_->counts[q]) + " values (root " + std::to_string(s_->roots[q]) +
                          ") and rank 0 " + std::to_string(s_->counts[0]) + " (root " +
                          std::to_string(s_->roots[0]) + "); every rank must call the same collectives";
        return;
      }
    }
    if (resize_scratch && s_->scratch.size() < s_->counts[0]) s_->scratch.resize(s_->counts[0]);
  }

  ThreadCommGroup::State* s_;
  int rank_;
};

}  // namespace

// A host ring's collectives take host buffers as they are.
CommStatus LocalComm::broadcast_host(float* values, size_t count, int root) {
  if (memory() == MemorySpace::kHost) return broadcast(values, count, root);
  return CommStatus::Error(name() + " keeps device buffers and does not stage host ones: this is a bug");
}

CommStatus LocalComm::all_gather_host(float* values, const std::vector<size_t>& counts) {
  if (memory() == MemorySpace::kHost) return all_gather(values, counts);
  return CommStatus::Error(name() + " keeps device buffers and does not stage host ones: this is a bug");
}

size_t PartOffset(const std::vector<size_t>& counts, int rank) {
  size_t at = 0;
  for (int q = 0; q < rank; q++) at += counts[q];
  return at;
}

ThreadCommGroup::ThreadCommGroup(int world_size) {
  DL_CHECK(world_size >= 1, "a ring needs at least one rank, not %d", world_size);
  state_ = std::make_unique<State>(world_size);
}

ThreadCommGroup::ThreadCommGroup(int world_size, std::shared_ptr<DeviceAllocations> device)
    : ThreadCommGroup(world_size) {
  DL_CHECK(device != nullptr, "a checking thread ring needs its device allocations");
  state_->device = std::move(device);
}

ThreadCommGroup::~ThreadCommGroup() = default;

int ThreadCommGroup::world_size() const { return state_->world; }

std::unique_ptr<LocalComm> ThreadCommGroup::comm(int rank) {
  DL_CHECK(rank >= 0 && rank < state_->world, "rank %d outside [0, %d)", rank, state_->world);
  return std::make_unique<ThreadComm>(state_.get(), rank);
}

void ThreadCommGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lk(state_->mu);
  state_->aborted = true;
  state_->abort_reason = reason;
  state_->cv.notify_all();
}

}  // namespace diloco
