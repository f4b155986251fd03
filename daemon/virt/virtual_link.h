// One direction of an emulated link under the virtual clock: messages leave one after the other
// at the link's bandwidth (a message waits for the one before it), arrive latency (+ jitter) later
// in the order they left (a TCP connection does not reorder), and are lost with probability loss.
// The draws come from the link's own seeded generator (kernels/rng.h: the same on every platform).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "daemon/config/sync_config.h"  // LinkConfig
#include "kernels/rng.h"

namespace diloco {

class VirtualLink {
 public:
  VirtualLink(const LinkConfig& config, uint64_t seed) : config_(config), rng_(seed) {}

  // A message of `bytes` handed to the link at t_ns: when it arrives, or nothing when lost.
  // payload: it carries the model (a Delta or a Global charged the real model's size), counted
  // apart for `dilococtl simulate`'s WAN figures.
  std::optional<int64_t> Send(int64_t t_ns, size_t bytes, bool payload = false);
  // While cut (a partition), everything sent is lost.
  void SetCut(bool cut) { cut_ = cut; }

  // From now on, payload bytes are also counted per window of window_ns (by when they start to
  // leave), for PeakGbps.
  void CountWindows(int64_t window_ns) { window_ns_ = window_ns; }
  // The busiest window's payload rate (0 unless CountWindows).
  double PeakGbps() const;
  uint64_t payload_bytes() const { return payload_bytes_; }

  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t messages() const { return messages_; }
  uint64_t lost() const { return lost_; }
  // Virtual time the link spent sending (bytes over bandwidth), for utilisation figures.
  int64_t busy_ns() const { return busy_ns_; }

 private:
  LinkConfig config_;
  Rng rng_;
  bool cut_ = false;
  int64_t free_at_ns_ = 0;       // the previous message has left by then
  int64_t last_arrival_ns_ = 0;  // arrivals keep their order
  uint64_t bytes_sent_ = 0, messages_ = 0, lost_ = 0, payload_bytes_ = 0;
  int64_t busy_ns_ = 0;
  int64_t window_ns_ = 0;
  std::vector<double> window_bytes_;
};

}  // namespace diloco
