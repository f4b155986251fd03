// A learner's liveness heartbeats, from a thread and a socket of their own (protocol.h: the
// liveness stream): the training thread only updates what they say, so a 10 s step or a 30 s
// delta transfer on the main stream does not make a healthy learner look dead. The thread stops
// sending the moment the learner crashes (as a failed site would) or stops.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <future>
#include <thread>
#include <vector>

#include "daemon/net/context.h"
#include "daemon/net/envelope.h"
#include "daemon/net/socket.h"
#include "daemon/util/status.h"

namespace diloco {

struct LivenessOptions {
  std::string job_id;
  std::string sender;        // the learner's name
  uint64_t incarnation = 0;  // the learner's (its main stream's) incarnation
  // Every syncer shard's uplink SUB (each hears every beat), with its socket's security and link
  // (as the learner's other sockets to that shard).
  struct Target {
    std::string endpoint;
    net::SocketOptions socket;
  };
  std::vector<Target> targets;
  int interval_ms = 200;
  const std::atomic<bool>* crash = nullptr;  // set: send nothing more
};

class LivenessSender {
 public:
  // Connects a PUB per target on its thread; returns once they are connected (or one failed).
  static Status Start(net::NetContext& context, const LivenessOptions& options, std::unique_ptr<LivenessSender>* out);
  ~LivenessSender();  // Stop()

  // What the next beats say (called by the training thread; cheap).
  void Update(const HeartbeatMsg& heartbeat);
  // No beat after this returns.
  void Stop();
  uint64_t bytes_sent() const { return bytes_sent_; }  // wire bytes of the beats sent

 private:
  LivenessSender() = default;
  void Run(net::NetContext& context, std::promise<Status>* started);

  LivenessOptions options_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;       // guarded by mu_
  bool have_beat_ = false;  // guarded by mu_
  HeartbeatMsg beat_;       // guarded by mu_
  std::atomic<uint64_t> bytes_sent_{0};
};

}  // namespace diloco
