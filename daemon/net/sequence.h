// Per-sender sequence numbers: PUB/SUB is lossy by design, so every message carries
// (sender, epoch, seq) and the receiver classifies each arrival. Pure logic, no I/O.
//
// seq starts at any value and increases by 1 per message of a sender. epoch identifies one
// incarnation of the sender (e.g. its start time or a random nonce): a restarted sender begins a
// new sequence without being mistaken for a replay.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace diloco::net {

enum class SeqVerdict {
  kFirst,      // first message seen from this sender
  kInOrder,    // seq == last + 1
  kGap,        // seq > last + 1: `missed` messages were lost; the tracker moves on to seq
  kDuplicate,  // seq <= last (a replay or a duplicate): drop it
  kRestart,    // a new epoch: the sender restarted; its sequence starts over
};
const char* ToString(SeqVerdict v);

struct SeqObservation {
  SeqVerdict verdict = SeqVerdict::kFirst;
  uint64_t missed = 0;  // kGap only
  bool deliver() const { return verdict != SeqVerdict::kDuplicate; }
};

struct SenderSeqState {
  uint64_t epoch = 0;
  uint64_t last_seq = 0;
};

// Pure: the verdict for (epoch, seq) given the sender's state (nullptr: never seen), and the new state.
SeqObservation DecideSequence(const SenderSeqState* state, uint64_t epoch, uint64_t seq, SenderSeqState* next);

class SequenceTracker {
 public:
  SeqObservation Observe(std::string_view sender, uint64_t epoch, uint64_t seq);
  void Forget(std::string_view sender);
  size_t senders() const { return state_.size(); }

  uint64_t gaps() const { return gaps_; }            // gap events
  uint64_t missed() const { return missed_; }        // messages lost in all gaps
  uint64_t duplicates() const { return duplicates_; }
  uint64_t restarts() const { return restarts_; }

 private:
  std::unordered_map<std::string, SenderSeqState> state_;
  uint64_t gaps_ = 0, missed_ = 0, duplicates_ = 0, restarts_ = 0;
};

// The sending side: 1, 2, 3, ... per incarnation.
class SequenceCounter {
 public:
  explicit SequenceCounter(uint64_t epoch) : epoch_(epoch) {}
  uint64_t epoch() const { return epoch_; }
  uint64_t Next() { return ++last_; }

 private:
  uint64_t epoch_;
  uint64_t last_ = 0;
};

// A fresh epoch for a new incarnation: wall-clock nanoseconds mixed with randomness.
uint64_t NewEpoch();

}  // namespace diloco::net
