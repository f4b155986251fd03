// Helpers for the transport tests: a minimal test framing (until the wire's envelope is used),
// deadlines instead of sleeps, and log capture.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/net/channel.h"
#include "daemon/net/context.h"
#include "daemon/net/net_log.h"

namespace diloco::net::testing {

// Test framing: frame 0 = "T|<sender>|<epoch>|<seq>" (sequenced) or "P" (probe, unsequenced);
// any further frames are payload.
inline Message TestMessage(const std::string& sender, uint64_t epoch, uint64_t seq, const std::string& payload = "") {
  Message m;
  m.AddCopy("T|" + sender + "|" + std::to_string(epoch) + "|" + std::to_string(seq));
  if (!payload.empty()) m.AddCopy(payload);
  return m;
}
inline Message ProbeMessage() {
  Message m;
  m.AddCopy(std::string("P"));
  return m;
}

inline Status TestValidator(const Message& m, MessageMeta* meta) {
  if (m.empty()) return Status::Error("no frames");
  const std::string h(m.frame_view(0));
  if (h == "P") {
    meta->sequenced = false;
    return Status::Ok();
  }
  if (h.size() < 2 || h[0] != 'T' || h[1] != '|') return Status::Error("not a test header");
  const size_t a = h.find('|', 2);
  const size_t b = a == std::string::npos ? a : h.find('|', a + 1);
  if (b == std::string::npos) return Status::Error("truncated test header");
  meta->sender = h.substr(2, a - 2);
  try {
    meta->epoch = std::stoull(h.substr(a + 1, b - a - 1));
    meta->seq = std::stoull(h.substr(b + 1));
  } catch (...) {
    return Status::Error("bad numbers in test header");
  }
  if (meta->sender.empty()) return Status::Error("empty sender");
  return Status::Ok();
}

inline ReceiveOptions TestReceiveOptions() {
  ReceiveOptions r;
  r.validator = TestValidator;
  return r;
}

inline SocketOptions Plain(const std::string& name) {
  SocketOptions o;
  o.name = name;
  o.allow_plaintext = true;
  o.linger_ms = 0;
  return o;
}

// A copy of a message's frames (so one good message can be mutated many ways).
inline Message CopyFrames(const Message& m) {
  Message c;
  for (size_t i = 0; i < m.size(); ++i) c.AddCopy(m.frame(i).data(), m.frame(i).size());
  return c;
}

inline std::unique_ptr<NetContext> MakeContext() {
  std::unique_ptr<NetContext> ctx;
  REQUIRE(NetContext::Create({}, &ctx).ok());
  return ctx;
}

// Polls pred every millisecond until it holds or timeout passes.
inline bool WaitFor(const std::function<bool()>& pred, int timeout_ms = 5000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

// Publishes probes until the subscriber gets one (PUB/SUB "slow joiner"), then drains probes.
inline void SyncPubSub(PubChannel& pub, SubChannel& sub, const std::string& topic, int timeout_ms = 5000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool got = false;
  while (!got && std::chrono::steady_clock::now() < deadline) {
    Message probe = ProbeMessage();
    pub.Publish(topic, probe);
    Received r;
    got = sub.Receive(&r, 10) == RecvResult::kMessage;
  }
  REQUIRE(got);
  Received r;
  while (sub.Receive(&r, 20) == RecvResult::kMessage) {
  }
}

// Captures net log lines while alive.
class LogCapture {
 public:
  LogCapture() {
    SetNetLogSink([this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    });
  }
  ~LogCapture() { SetNetLogSink(nullptr); }
  bool Contains(const std::string& needle) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& l : lines_) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

}  // namespace diloco::net::testing
