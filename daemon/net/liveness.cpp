#include "daemon/net/liveness.h"

#include <algorithm>

namespace diloco::net {

const char* ToString(PeerState s) { return s == PeerState::kAlive ? "alive" : "dead"; }

LivenessDecision DecideLiveness(SteadyTime now, SteadyTime last_heard, const LivenessOptions& options) {
  const int64_t silent_ms =
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard).count());
  const int64_t interval = std::max<int64_t>(1, options.heartbeat_interval_ms);
  LivenessDecision d;
  d.missed_intervals = silent_ms / interval;
  if (d.missed_intervals >= options.missed_intervals_dead) {
    d.state = PeerState::kDead;
    d.reason = "silent for " + std::to_string(silent_ms) + " ms (" + std::to_string(d.missed_intervals) +
               " heartbeat intervals of " + std::to_string(interval) + " ms; dead after " +
               std::to_string(options.missed_intervals_dead) + ")";
  } else {
    d.state = PeerState::kAlive;
    d.reason = "heard " + std::to_string(silent_ms) + " ms ago";
  }
  return d;
}

std::optional<PeerChange> LivenessTracker::Heard(const std::string& peer, SteadyTime now) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    peers_[peer] = {now, PeerState::kAlive};
    return PeerChange{peer, PeerState::kAlive, "first heartbeat"};
  }
  it->second.last_heard = std::max(it->second.last_heard, now);
  if (it->second.state == PeerState::kDead) {
    it->second.state = PeerState::kAlive;
    return PeerChange{peer, PeerState::kAlive, "heard again after being declared dead"};
  }
  return std::nullopt;
}

std::vector<PeerChange> LivenessTracker::Check(SteadyTime now) {
  std::vector<PeerChange> changes;
  for (auto& [name, p] : peers_) {
    if (p.state == PeerState::kDead) continue;
    const LivenessDecision d = DecideLiveness(now, p.last_heard, options_);
    if (d.state == PeerState::kDead) {
      p.state = PeerState::kDead;
      changes.push_back({name, PeerState::kDead, d.reason});
    }
  }
  return changes;
}

PeerState LivenessTracker::state(const std::string& peer) const {
  const auto it = peers_.find(peer);
  return it == peers_.end() ? PeerState::kDead : it->second.state;
}

std::vector<std::string> LivenessTracker::alive() const {
  std::vector<std::string> out;
  for (const auto& [name, p] : peers_) {
    if (p.state == PeerState::kAlive) out.push_back(name);
  }
  return out;
}

size_t LivenessTracker::alive_count() const {
  return std::count_if(peers_.begin(), peers_.end(), [](const auto& kv) { return kv.second.state == PeerState::kAlive; });
}

bool HeartbeatTimer::Due(SteadyTime now) {
  if (next_ && now < *next_) return false;
  // Re-arm from now (not from the missed deadline): no burst after a stall.
  next_ = now + interval_;
  return true;
}

int64_t HeartbeatTimer::MsUntilDue(SteadyTime now) const {
  if (!next_ || now >= *next_) return 0;
  return std::chrono::duration_cast<std::chrono::milliseconds>(*next_ - now).count() + 1;
}

}  // namespace diloco::net
