// One direction of an emulated link under the virtual clock: messages leave one after the other
// at the link's bandwidth (a message waits for the one before it), arrive latency (+ jitter) later
// in the order they left (a TCP connection does not reorder), and are lost with probability loss.
// The draws come from the link's own seeded generator (kernels/rng.h: the same on every platform).
//
// Faults for deterministic simulation testing (SetFaults, dst.h), drawn from a generator of their
// own so that a link without them draws exactly as before: a message is duplicated (a copy
// arrives too, up to window_ms after the original) or held back (it arrives up to window_ms
// late, and messages sent after it may arrive first). What a reconnecting or retransmitting path
// between two processes can do that one TCP connection does not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "daemon/config/sync_config.h"  // LinkConfig
#include "kernels/rng.h"

namespace diloco {

struct LinkFaults {
  double duplicate = 0;  // probability that a message that arrives arrives twice
  double reorder = 0;    // probability that a message is held back behind later ones
  double window_ms = 0;  // how late a held-back message or a copy arrives, at most
  bool any() const { return (duplicate > 0 || reorder > 0) && window_ms > 0; }
};

class VirtualLink {
 public:
  VirtualLink(const LinkConfig& config, uint64_t seed) : config_(config), rng_(seed) {}

  // A message of `bytes` handed to the link at t_ns: when it arrives, or nothing when lost.
  // payload: it carries the model (a Delta or a Global charged the real model's size), counted
  // apart for `dilococtl simulate`'s WAN figures.
  std::optional<int64_t> Send(int64_t t_ns, size_t bytes, bool payload = false);
  // While cut (a partition), everything sent is lost.
  void SetCut(bool cut) { cut_ = cut; }
  // From now on, the faults above, drawn from seed.
  void SetFaults(const LinkFaults& faults, uint64_t seed) {
    faults_ = faults;
    fault_rng_ = Rng(seed);
  }
  // After a Send that arrives: when its copy arrives, if it was duplicated.
  std::optional<int64_t> duplicate_ns() const { return duplicate_ns_; }

  // From now on, payload bytes are also counted per window of window_ns (by when they start to
  // leave), for PeakGbps.
  void CountWindows(int64_t window_ns) { window_ns_ = window_ns; }
  // The busiest window's payload rate (0 unless CountWindows).
  double PeakGbps() const;
  uint64_t payload_bytes() const { return payload_bytes_; }

  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t messages() const { return messages_; }
  uint64_t lost() const { return lost_; }
  uint64_t duplicated() const { return duplicated_; }
  uint64_t reordered() const { return reordered_; }
  // Virtual time the link spent sending (bytes over bandwidth), for utilisation figures.
  int64_t busy_ns() const { return busy_ns_; }

 private:
  LinkConfig config_;
  Rng rng_;
  bool cut_ = false;
  LinkFaults faults_;
  Rng fault_rng_{0};
  std::optional<int64_t> duplicate_ns_;
  uint64_t duplicated_ = 0, reordered_ = 0;
  int64_t free_at_ns_ = 0;       // the previous message has left by then
  int64_t last_arrival_ns_ = 0;  // arrivals keep their order
  uint64_t bytes_sent_ = 0, messages_ = 0, lost_ = 0, payload_bytes_ = 0;
  int64_t busy_ns_ = 0;
  int64_t window_ns_ = 0;
  std::vector<double> window_bytes_;
};

}  // namespace diloco
