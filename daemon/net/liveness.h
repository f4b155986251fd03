// Heartbeat liveness: a peer is dead once `missed_intervals_dead` heartbeat intervals pass without
// hearing from it (any valid message counts). Pure logic with the clock injected: every call
// takes `now`, so tests drive time by hand.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace diloco::net {

using SteadyTime = std::chrono::steady_clock::time_point;

struct LivenessOptions {
  int64_t heartbeat_interval_ms = 1000;  // how often peers send heartbeats
  int missed_intervals_dead = 3;         // silent for this many intervals -> dead
};

enum class PeerState { kAlive, kDead };
const char* ToString(PeerState s);

struct LivenessDecision {
  PeerState state = PeerState::kAlive;
  int64_t missed_intervals = 0;  // whole intervals since the peer was last heard
  std::string reason;
};

// Pure: the state of a peer last heard at last_heard.
LivenessDecision DecideLiveness(SteadyTime now, SteadyTime last_heard, const LivenessOptions& options);

struct PeerChange {
  std::string peer;
  PeerState state;
  std::string reason;
};

class LivenessTracker {
 public:
  explicit LivenessTracker(const LivenessOptions& options) : options_(options) {}

  // The peer was heard from. Returns a change when it was dead (or unknown) and is alive now.
  std::optional<PeerChange> Heard(const std::string& peer, SteadyTime now);
  // Peers that changed state since the last call (alive -> dead), each reported once.
  std::vector<PeerChange> Check(SteadyTime now);
  // Stops tracking a peer (e.g. it left cleanly).
  void Forget(const std::string& peer) { peers_.erase(peer); }

  PeerState state(const std::string& peer) const;  // unknown peers are dead
  std::vector<std::string> alive() const;
  size_t alive_count() const;
  const LivenessOptions& options() const { return options_; }

 private:
  struct Peer {
    SteadyTime last_heard;
    PeerState state = PeerState::kAlive;
  };
  LivenessOptions options_;
  std::map<std::string, Peer> peers_;
};

// The sending side: due once per interval.
class HeartbeatTimer {
 public:
  explicit HeartbeatTimer(int64_t interval_ms) : interval_(std::chrono::milliseconds(interval_ms)) {}
  // True (and re-arms) when a heartbeat is due at now; the first call is always due.
  bool Due(SteadyTime now);
  // Milliseconds until the next heartbeat is due (0 when due), for poll timeouts.
  int64_t MsUntilDue(SteadyTime now) const;

 private:
  std::chrono::milliseconds interval_;
  std::optional<SteadyTime> next_;
};

}  // namespace diloco::net
