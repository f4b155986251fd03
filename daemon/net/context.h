// The process's ZeroMQ context plus what must exist once per context: the ZAP handler.
// Every Socket, Link and channel of a process is made from one NetContext (inproc endpoints only
// connect within a context). Destroy sockets, channels and links before their NetContext.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "daemon/net/zap.h"
#include "daemon/util/status.h"

namespace diloco::net {

struct NetContextOptions {
  // ZeroMQ I/O threads. ZeroMQ serves each connection on one I/O thread (a new connection goes to
  // the least loaded), so N threads encrypt/decrypt N peers' CURVE traffic at once; one thread
  // moves about 1 GB/s of plain tcp but only 0.2-0.9 GB/s of CURVE. The daemon's context takes
  // net.io_threads (default DefaultIoThreads()).
  int io_threads = 1;
  int max_sockets = 1024;  // ZMQ_MAX_SOCKETS
};

// The I/O threads a daemon's context gets when its config does not say: min(4, hardware threads),
// at least 1. A syncer taking int4 deltas of a 12B model from 8 learners needs ~2 GB/s of CURVE.
int DefaultIoThreads();

class NetContext {
 public:
  static Status Create(const NetContextOptions& options, std::unique_ptr<NetContext>* out);
  ~NetContext();  // stops the ZAP handler and link threads, then terminates the context
  NetContext(const NetContext&) = delete;
  NetContext& operator=(const NetContext&) = delete;

  zmq::context_t& zmq() { return context_; }

  // Starts the ZAP handler (once; later calls are no-ops). Socket::Create calls this for CURVE
  // servers, so an allowlist is always enforced.
  Status EnsureZap();
  // Replaces the allowlist of a ZAP domain (Z85 public keys). Starts the handler if needed.
  Status SetAllowlist(const std::string& domain, const std::vector<std::string>& public_keys_z85);
  ZapStats zap_stats() const;
  uint64_t zap_refused_count(const std::string& key_z85) const;

  // A process-unique number, for inproc endpoint names.
  uint64_t NextId();

 private:
  explicit NetContext(const NetContextOptions& options);

  zmq::context_t context_;
  mutable std::mutex mu_;
  std::unique_ptr<ZapHandler> zap_;
  uint64_t next_id_ = 1;
};

}  // namespace diloco::net
