#include "daemon/metrics/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <httplib.h>

namespace diloco {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// httplib's default sets SO_REUSEPORT, which would let a second daemon bind
// the same port silently and split the scrapes between the two. REUSEADDR
// alone only skips TIME_WAIT after a restart.
void ExclusiveSocketOptions(socket_t sock) {
  int yes = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// Why binding failed: httplib reports only false, so try the same bind on a
// socket of our own to get errno.
std::string BindFailureReason(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return "not an IPv4 address";
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  std::string reason = "cannot bind";
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) reason = std::strerror(errno);
  ::close(fd);
  return reason;
}

}  // namespace

Status MetricsServer::Start(const MetricsServerOptions& options, const MetricsRegistry* registry,
                            std::unique_ptr<MetricsServer>* out) {
  const std::string where = options.host + ":" + std::to_string(options.port);
  if (options.port < 0 || options.port > 65535)
    return Status::Error("metrics port " + std::to_string(options.port) +
                         " is out of range: use 1..65535");
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->host_ = options.host;
  s->server_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *s->server_;
  const int workers = options.worker_threads > 0 ? options.worker_threads : 1;
  http.new_task_queue = [workers] { return new httplib::ThreadPool((size_t)workers); };
  http.set_socket_options(ExclusiveSocketOptions);
  // One request per connection: a scraper's idle keep-alive would otherwise
  // hold Stop() for the keep-alive timeout.
  http.set_keep_alive_max_count(1);
  http.set_read_timeout(options.read_timeout_s, 0);
  http.set_write_timeout(options.read_timeout_s, 0);
  http.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), kContentType);
  });
  http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.status == 404) res.set_content("not found: metrics are at /metrics\n", "text/plain");
  });

  if (options.port == 0) {
    s->port_ = http.bind_to_any_port(options.host);
    if (s->port_ < 0)
      return Status::Error("cannot listen for metrics on " + options.host +
                           " (any port): " + BindFailureReason(options.host, 0));
  } else {
    if (!http.bind_to_port(options.host, options.port))
      return Status::Error("cannot listen for metrics on " + where + ": " +
                           BindFailureReason(options.host, options.port) +
                           ": is another dilocod or exporter using port " + std::to_string(options.port) +
                           "? choose another metrics_port");
    s->port_ = options.port;
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  s->thread_ = std::thread([&http, done] {
    http.listen_after_bind();
    *done = true;
  });
  // stop() is a no-op until the accept loop runs, so wait for it: a Stop()
  // right after Start() must not leave the thread listening forever.
  while (!http.is_running() && !*done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (*done) {
    s->Stop();
    return Status::Error("metrics server on " + options.host + ":" + std::to_string(s->port_) +
                         " stopped right after it started");
  }
  *out = std::move(s);
  return Status::Ok();
}

void MetricsServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

MetricsServer::~MetricsServer() { Stop(); }

std::string MetricsServer::url() const {
  return "http://" + host_ + ":" + std::to_string(port_) + "/metrics";
}

}  // namespace diloco
