// The gradient all-reduce of a local ddp run (sync.mode ddp, sync.learners M > 1): the M learner
// threads average their gradients every step through shared memory, blocking until every one has
// arrived. It does what a ring all-reduce does, in the same two phases (each member reduces one
// chunk over all members, then every member copies the whole mean), so every member ends up
// with bitwise the same mean: the sum runs over members in index order, whatever the timing.
// Nothing goes over a wire here; RingBytesPerMember says what a real ring of fp32 gradients
// would send, so wire bytes can be compared with the syncer modes.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace diloco {

class ThreadRing {
 public:
  ThreadRing(int members, size_t n);

  // Blocks until every member has called, then leaves in grads (n floats) the mean of every
  // member's grads. false when Abort() was called (a member failed): stop training.
  bool MeanInPlace(int member, float* grads);
  // Wakes every waiting member and makes every later call return false.
  void Abort();

  // Bytes one member sends per all-reduce of n fp32 values in a ring of `members`:
  // reduce-scatter and all-gather each move (members - 1) chunks of n / members values.
  static uint64_t RingBytesPerMember(int members, size_t n) {
    return members <= 1 ? 0 : (uint64_t)(2.0 * (members - 1) / members * 4.0 * (double)n);
  }

 private:
  bool Barrier();  // false once aborted
  const int members_;
  const size_t n_;
  std::vector<float*> grads_;  // each member's buffer during a call
  std::vector<float> mean_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

}  // namespace diloco
