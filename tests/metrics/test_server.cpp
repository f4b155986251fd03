#include "daemon/metrics/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>

namespace diloco {
namespace {

// A plain HTTP/1.0 GET over a socket of our own (not httplib's client), so
// the test checks what any scraper sees on the wire.
std::string RawGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  REQUIRE(::write(fd, req.data(), req.size()) == (ssize_t)req.size());
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, (size_t)n);
  ::close(fd);
  return resp;
}

std::string Body(const std::string& resp) {
  const size_t at = resp.find("\r\n\r\n");
  return at == std::string::npos ? "" : resp.substr(at + 4);
}

TEST_CASE("MetricsServer: GET /metrics returns the registry's text, other paths 404", "[e2e]") {
  MetricsRegistry r;
  REQUIRE(r.Declare("dilocod_steps_total", MetricKind::kCounter, "Inner steps.", {"job", "learner"}).ok());
  r.Add("dilocod_steps_total", {"job1", "0"}, 42);
  std::unique_ptr<MetricsServer> server;
  const Status st = MetricsServer::Start({.port = 0}, &r, &server);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(server->port() > 0);
  CHECK(server->url() == "http://127.0.0.1:" + std::to_string(server->port()) + "/metrics");

  std::string resp = RawGet(server->port(), "/metrics");
  CHECK(resp.rfind("HTTP/1.1 200", 0) == 0);
  CHECK_THAT(resp, Catch::Contains("Content-Type: text/plain; version=0.0.4"));
  CHECK(Body(resp) == r.Render());
  CHECK_THAT(Body(resp), Catch::Contains("dilocod_steps_total{job=\"job1\",learner=\"0\"} 42\n"));

  // Later updates show up in the next scrape.
  r.Add("dilocod_steps_total", {"job1", "0"}, 1);
  CHECK_THAT(Body(RawGet(server->port(), "/metrics")),
             Catch::Contains("dilocod_steps_total{job=\"job1\",learner=\"0\"} 43\n"));

  resp = RawGet(server->port(), "/");
  CHECK(resp.rfind("HTTP/1.1 404", 0) == 0);
  CHECK(RawGet(server->port(), "/metricsx").rfind("HTTP/1.1 404", 0) == 0);

  const auto t0 = std::chrono::steady_clock::now();
  server->Stop();
  server->Stop();  // idempotent
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("MetricsServer: a port in use is an error naming the port", "[e2e]") {
  MetricsRegistry r;
  std::unique_ptr<MetricsServer> first;
  REQUIRE(MetricsServer::Start({.port = 0}, &r, &first).ok());
  const int port = first->port();

  std::unique_ptr<MetricsServer> second;
  const Status st = MetricsServer::Start({.port = port}, &r, &second);
  REQUIRE_FALSE(st.ok());
  CHECK(second == nullptr);
  CHECK_THAT(st.message(), Catch::Contains("127.0.0.1:" + std::to_string(port)) &&
                               Catch::Contains("Address already in use") &&
                               Catch::Contains("metrics_port"));

  // Once the first is gone the port can be bound again (REUSEADDR: no wait for TIME_WAIT).
  first.reset();
  REQUIRE(MetricsServer::Start({.port = port}, &r, &second).ok());
  CHECK(second->port() == port);
}

TEST_CASE("MetricsServer: stop right after start returns promptly", "[e2e]") {
  MetricsRegistry r;
  for (int i = 0; i < 20; i++) {
    std::unique_ptr<MetricsServer> s;
    REQUIRE(MetricsServer::Start({}, &r, &s).ok());
    s.reset();
  }
}

TEST_CASE("MetricsServer: an out-of-range port is refused", "[unit]") {
  MetricsRegistry r;
  std::unique_ptr<MetricsServer> s;
  const Status st = MetricsServer::Start({.port = 70000}, &r, &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("70000"));
}

}  // namespace
}  // namespace diloco
