#include "daemon/virt/virtual_link.h"

#include <algorithm>
#include <cmath>

namespace diloco {

std::optional<int64_t> VirtualLink::Send(int64_t t_ns, size_t bytes, bool payload) {
  messages_++;
  duplicate_ns_.reset();
  bytes_sent_ += bytes;
  const int64_t start = std::max(t_ns, free_at_ns_);
  const int64_t serialise =
      config_.bandwidth_mbps > 0 ? (int64_t)std::llround((double)bytes * 8.0 / (config_.bandwidth_mbps * 1e6) * 1e9) : 0;
  free_at_ns_ = start + serialise;
  if (payload) payload_bytes_ += bytes;
  if (payload && window_ns_ > 0) {
    const size_t w = (size_t)(start / window_ns_);
    if (window_bytes_.size() <= w) window_bytes_.resize(w + 1, 0);
    window_bytes_[w] += (double)bytes;
  }
  busy_ns_ += serialise;
  // Draw both numbers for every message, lost or not, so one message's fate does not shift the
  // draws of the next.
  const double jitter = config_.jitter_ms > 0 ? rng_.uniform() * config_.jitter_ms : 0;
  const bool lost = rng_.uniform() < config_.loss || cut_;
  if (lost) {
    lost_++;
    return std::nullopt;
  }
  const int64_t arrival = free_at_ns_ + (int64_t)std::llround((config_.latency_ms + jitter) * 1e6);
  if (!faults_.any()) {
    last_arrival_ns_ = std::max(last_arrival_ns_, arrival);
    return last_arrival_ns_;
  }
  // Faults: all four numbers drawn for every message that arrives, as above.
  const bool held = fault_rng_.uniform() < faults_.reorder;
  const double held_ms = fault_rng_.uniform() * faults_.window_ms;
  const bool duplicated = fault_rng_.uniform() < faults_.duplicate;
  const double copy_ms = fault_rng_.uniform() * faults_.window_ms;
  int64_t at = std::max(last_arrival_ns_, arrival);
  if (held) {
    // Held back: later messages do not wait for it (last_arrival_ns_ stays).
    reordered_++;
    at = arrival + (int64_t)std::llround(held_ms * 1e6);
  } else {
    last_arrival_ns_ = at;
  }
  if (duplicated) {
    duplicated_++;
    duplicate_ns_ = at + (int64_t)std::llround(copy_ms * 1e6);
  }
  return at;
}

}  // namespace diloco

namespace diloco {

double VirtualLink::PeakGbps() const {
  double peak = 0;
  for (double b : window_bytes_) peak = std::max(peak, b * 8 / ((double)window_ns_ / 1e9) / 1e9);
  return peak;
}

}  // namespace diloco
