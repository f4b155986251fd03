#include "daemon/net/sequence.h"

#include <chrono>
#include <random>

namespace diloco::net {

const char* ToString(SeqVerdict v) {
  switch (v) {
    case SeqVerdict::kFirst: return "first";
    case SeqVerdict::kInOrder: return "in order";
    case SeqVerdict::kGap: return "gap";
    case SeqVerdict::kDuplicate: return "duplicate";
    case SeqVerdict::kRestart: return "restart";
  }
  return "?";
}

SeqObservation DecideSequence(const SenderSeqState* state, uint64_t epoch, uint64_t seq, SenderSeqState* next) {
  if (state == nullptr) {
    *next = {epoch, seq};
    return {SeqVerdict::kFirst, 0};
  }
  if (epoch != state->epoch) {
    *next = {epoch, seq};
    return {SeqVerdict::kRestart, 0};
  }
  if (seq <= state->last_seq) {
    *next = *state;
    return {SeqVerdict::kDuplicate, 0};
  }
  *next = {epoch, seq};
  if (seq == state->last_seq + 1) return {SeqVerdict::kInOrder, 0};
  return {SeqVerdict::kGap, seq - state->last_seq - 1};
}

SeqObservation SequenceTracker::Observe(std::string_view sender, uint64_t epoch, uint64_t seq) {
  auto it = state_.find(std::string(sender));
  SenderSeqState next;
  const SeqObservation obs = DecideSequence(it == state_.end() ? nullptr : &it->second, epoch, seq, &next);
  if (it == state_.end()) {
    state_.emplace(std::string(sender), next);
  } else {
    it->second = next;
  }
  switch (obs.verdict) {
    case SeqVerdict::kGap:
      ++gaps_;
      missed_ += obs.missed;
      break;
    case SeqVerdict::kDuplicate: ++duplicates_; break;
    case SeqVerdict::kRestart: ++restarts_; break;
    default: break;
  }
  return obs;
}

void SequenceTracker::Forget(std::string_view sender) { state_.erase(std::string(sender)); }

uint64_t NewEpoch() {
  const uint64_t t = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  std::random_device rd;
  return t ^ (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace diloco::net
