#include "daemon/train/thread_ring.h"

#include <algorithm>
#include <cstring>

namespace diloco {

ThreadRing::ThreadRing(int members, size_t n) : members_(members), n_(n), grads_(members, nullptr), mean_(n) {}

bool ThreadRing::Barrier() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return false;
  const uint64_t gen = generation_;
  if (++waiting_ == members_) {
    waiting_ = 0;
    generation_++;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  return !aborted_;
}

void ThreadRing::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

bool ThreadRing::MeanInPlace(int member, float* grads) {
  if (members_ == 1) return true;
  grads_[member] = grads;
  // Every buffer is registered, and every member has copied out the previous mean.
  if (!Barrier()) return false;
  // Reduce-scatter: this member's chunk, summed over the members in index order.
  const size_t chunk = (n_ + members_ - 1) / members_;
  const size_t lo = std::min(n_, chunk * member), hi = std::min(n_, lo + chunk);
  const float inv = 1.0f / (float)members_;
  for (size_t i = lo; i < hi; i++) {
    float s = grads_[0][i];
    for (int k = 1; k < members_; k++) s += grads_[k][i];
    mean_[i] = s * inv;
  }
  // Every chunk is done (and nobody reads the members' buffers any more): all-gather.
  if (!Barrier()) return false;
  std::memcpy(grads, mean_.data(), n_ * sizeof(float));
  return true;
}

}  // namespace diloco
