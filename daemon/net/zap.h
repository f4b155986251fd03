// ZAP (ZeroMQ Authentication Protocol, RFC 27) handler: admits CURVE clients whose public key is on
// the allowlist of the server socket's ZAP domain, refuses everyone else. A refused peer is logged
// with its Z85 key and address (on its 1st, 2nd, 4th, 8th... refusal) and counted.
//
// One handler per ZeroMQ context, on its own thread, bound to inproc://zeromq.zap.01; NetContext
// starts it before the first CURVE server socket exists (without a handler libzmq would admit
// every client).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "daemon/util/status.h"

namespace diloco::net {

// The fields of a ZAP request that the decision looks at.
struct ZapRequest {
  std::string domain;         // the server socket's ZMQ_ZAP_DOMAIN
  std::string address;        // peer IP address
  std::string mechanism;      // "NULL", "PLAIN" or "CURVE"
  std::string client_key_z85; // CURVE: the client's long-term public key
};

struct ZapDecision {
  bool admit = false;
  std::string reason;  // for the log and the ZAP status text
};

// Pure: CURVE clients whose key is on domain's allowlist are admitted; everything else is refused.
ZapDecision DecideZap(const ZapRequest& request, const std::map<std::string, std::set<std::string>>& allowlists);

struct ZapStats {
  uint64_t admitted = 0;
  uint64_t refused = 0;
};

class ZapHandler {
 public:
  explicit ZapHandler(zmq::context_t& context);
  ~ZapHandler();  // the thread ends when the context shuts down; Stop() joins it
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Binds inproc://zeromq.zap.01 and starts the thread. Fails when another handler is bound.
  Status Start();
  // Ends the thread (call before terminating the context; idempotent).
  void Stop();

  // Replaces domain's allowlist (Z85 public keys). Thread-safe; applies to the next handshake.
  Status SetAllowlist(const std::string& domain, const std::vector<std::string>& public_keys_z85);

  ZapStats stats() const;
  // Refusals of one key so far.
  uint64_t refused_count(const std::string& key_z85) const;

 private:
  void Run(zmq::socket_t socket);

  zmq::context_t& context_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::map<std::string, std::set<std::string>> allowlists_;  // domain -> keys
  std::map<std::string, uint64_t> refused_by_key_;
  ZapStats stats_;
};

}  // namespace diloco::net
