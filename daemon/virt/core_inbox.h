// What reached a virtual learner since its core last looked: the downlink's and the DEALER's
// messages in arrival order, checked as the sockets' validators check them (ParseEnvelope, the
// downlink's sequence numbers) before the core sees them. Shared by the threaded virtual learner
// and the timed one of `dilococtl simulate`, so both hand their core the same messages.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <utility>

#include "daemon/net/envelope.h"
#include "daemon/net/sequence.h"
#include "daemon/net/socket.h"
#include "daemon/train/learner_core.h"

namespace diloco {

class CoreInbox {
 public:
  // The checks of the core's sockets (LearnerCore::downlink_expect / dealer_expect); topic: the job.
  void Expect(ParseOptions downlink, ParseOptions dealer, std::string topic) {
    down_expect_ = std::move(downlink);
    dealer_expect_ = std::move(dealer);
    topic_ = std::move(topic);
  }
  void Push(bool from_dealer, net::Message&& m) { queue_.emplace_back(from_dealer, std::move(m)); }
  bool empty() const { return queue_.empty(); }
  // Hands core every message, in order; note gets what fails its checks (and is dropped).
  Status Drain(LearnerCore& core, const std::function<void(const std::string&)>& note);

 private:
  ParseOptions down_expect_, dealer_expect_;
  std::string topic_;
  net::SequenceTracker down_seq_;
  std::deque<std::pair<bool, net::Message>> queue_;  // (from the dealer?, frames)
};

}  // namespace diloco
