// The metrics endpoint: GET http://<host>:<port>/metrics serves
// MetricsRegistry::Render() as "text/plain; version=0.0.4"; every other path
// is a 404. cpp-httplib runs on its own thread (plus a small worker pool);
// the registry must outlive the server.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "daemon/metrics/registry.h"
#include "daemon/util/status.h"

namespace httplib {
class Server;
}

namespace diloco {

struct MetricsServerOptions {
  std::string host = "127.0.0.1";  // loopback only by default: metrics are not authenticated
  int port = 0;                    // 0 = any free port (see MetricsServer::port())
  int worker_threads = 2;          // scrapes are rare and cheap
  int read_timeout_s = 2;          // bounds how long Stop() can wait for a silent client
};

class MetricsServer {
 public:
  // Binds host:port and starts serving. An error names host:port and the
  // reason (e.g. "Address already in use") when the port cannot be bound;
  // the port is never shared with another listener (no SO_REUSEPORT).
  static Status Start(const MetricsServerOptions& options, const MetricsRegistry* registry,
                      std::unique_ptr<MetricsServer>* out);

  // Stops listening, finishes requests in flight and joins the thread.
  // Idempotent; the destructor calls it.
  void Stop();
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // "http://127.0.0.1:<port>/metrics"
  std::string url() const;

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

}  // namespace diloco
