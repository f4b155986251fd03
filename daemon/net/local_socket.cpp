#include "daemon/net/local_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "daemon/net/net_log.h"

namespace diloco::net {
namespace {

using Clock = std::chrono::steady_clock;

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

Status UnixAddress(const std::string& path, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr->sun_path) {
    return Status::Error("socket path '" + path + "' is empty or longer than " +
                         std::to_string(sizeof addr->sun_path - 1) + " bytes; choose a shorter one");
  }
  std::memcpy(addr->sun_path, path.data(), path.size());
  return Status::Ok();
}

PeerCred PeerOf(int fd) {
  PeerCred p;
  ucred c{};
  socklen_t len = sizeof c;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) == 0) {
    p.pid = c.pid;
    p.uid = (int)c.uid;
    p.gid = (int)c.gid;
  }
  return p;
}

int MsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : (int)std::min<int64_t>(left, 1 << 30);
}

// Waits for events on fd until deadline: false on timeout.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, MsLeft(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the read or write say what is wrong
  }
}

int64_t MsSince(SteadyTime then, SteadyTime now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - then).count();
}

}  // namespace

std::string PeerCred::ToString() const {
  if (pid < 0) return "an unknown peer";
  return "pid " + std::to_string(pid) + " uid " + std::to_string(uid);
}

// ---- LocalServer ----

LocalServer::LocalServer(std::string path, LocalServerOptions options)
    : path_(std::move(path)), options_(std::move(options)), scratch_(64 << 10) {}

Status LocalServer::Create(const std::string& path, LocalServerOptions options, std::unique_ptr<LocalServer>* out) {
  if (!options.validator) return Status::Error(options.name + ": a LocalServer needs a validator");
  if (options.max_connections == 0) return Status::Error(options.name + ": max_connections must be at least 1");
  sockaddr_un addr;
  DL_RETURN_IF_ERROR(UnixAddress(path, &addr).WithContext(options.name));
  std::unique_ptr<LocalServer> s(new LocalServer(path, std::move(options)));
  s->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return Status::Error(s->options_.name + ": " + Errno("socket"));
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    const std::string msg = s->options_.name + ": cannot bind " + path + ": " + std::strerror(e);
    if (e == EADDRINUSE) return Status::AddressInUse(msg + " (remove the stale file, or stop what serves it)");
    return Status::Error(msg);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    s->dev_ = st.st_dev;
    s->ino_ = st.st_ino;
  }
  if (::listen(s->listen_fd_, 64) != 0) return Status::Error(s->options_.name + ": " + Errno("listen"));
  *out = std::move(s);
  return Status::Ok();
}

LocalServer::~LocalServer() {
  for (auto& [id, c] : connections_) ::close(c.fd);
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(path_.c_str());
  }
}

void LocalServer::AddPollFds(std::vector<PollFd>* fds) const {
  fds->push_back({listen_fd_, ZMQ_POLLIN, 0});
  for (const auto& [id, c] : connections_) {
    short events = 0;
    if (c.decoder.wanted() > 0) events |= ZMQ_POLLIN;  // not while a whole request waits for Receive
    if (c.out_sent < c.out.size()) events |= ZMQ_POLLOUT;
    fds->push_back({c.fd, events, 0});
  }
}

void LocalServer::Service(std::span<const PollFd> fds) {
  bool accept = false;
  for (const PollFd& f : fds) {
    if (f.revents == 0) continue;
    if (f.fd == listen_fd_) {
      accept = true;
      continue;
    }
    auto it = by_fd_.find(f.fd);
    if (it == by_fd_.end()) continue;
    const uint64_t id = it->second;
    if (f.revents & ZMQ_POLLOUT) Write(connections_.at(id));
    auto c = connections_.find(id);
    if (c == connections_.end()) continue;
    // An error or hang-up is read as one: read() says which.
    if ((f.revents & (ZMQ_POLLIN | ZMQ_POLLERR)) && c->second.decoder.wanted() > 0) Read(c->second);
  }
  CheckTimeouts(options_.clock());
  // Last: a connection closed above may hand its fd number to a new one.
  if (accept) Accept();
}

void LocalServer::Accept() {
  for (int i = 0; i < 64; i++) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) {
        NetLogf("net.local", "%s: %s", options_.name.c_str(), Errno("accept").c_str());
      }
      return;
    }
    if (connections_.size() >= options_.max_connections) Evict();
    const uint64_t id = next_id_++;
    Connection c(options_.limits);
    c.id = id;
    c.fd = fd;
    c.peer = PeerOf(fd);
    c.last_activity = options_.clock();
    connections_.emplace(id, std::move(c));
    by_fd_[fd] = id;
    stats_.accepted++;
    stats_.connections = connections_.size();
  }
}

// Closes the connection idle longest, keeping those that wait on a reply while it can.
void LocalServer::Evict() {
  const Connection* victim = nullptr;
  for (int pass = 0; pass < 2 && !victim; pass++) {
    for (const auto& [id, c] : connections_) {
      if (pass == 0 && c.requests_open > 0) continue;
      if (!victim || c.last_activity < victim->last_activity) victim = &c;
    }
  }
  if (victim) {
    Close(victim->id, CloseWhy::kEvicted,
          "closed to make room for a new connection (" + std::to_string(options_.max_connections) +
              " at most; this one was the idle longest)");
  }
}

void LocalServer::Read(Connection& c) {
  const uint64_t id = c.id;
  uint64_t budget = options_.read_budget_bytes;
  while (budget > 0) {
    const size_t want = std::min<uint64_t>({c.decoder.wanted(), scratch_.size(), budget});
    if (want == 0) return;
    const ssize_t n = ::read(c.fd, scratch_.data(), want);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Close(id, c.decoder.mid_message() ? CloseWhy::kMidMessage : CloseWhy::kQuiet, Errno("read"));
      return;
    }
    if (n == 0) {
      if (c.decoder.mid_message()) {
        Close(id, CloseWhy::kMidMessage,
              "hung up inside a request, after " + std::to_string(c.decoder.buffered_bytes()) + " bytes" +
                  (c.decoder.announced_bytes() ? " of " + std::to_string(c.decoder.announced_bytes()) : ""));
      } else {
        Close(id, CloseWhy::kQuiet, "");
      }
      return;
    }
    const SteadyTime now = options_.clock();
    if (!c.decoder.mid_message()) c.message_started = now;
    c.last_activity = now;
    budget -= (uint64_t)n;
    const uint64_t before = c.decoder.buffered_bytes();
    size_t taken = 0;
    const Status st = c.decoder.Feed({scratch_.data(), (size_t)n}, &taken);
    if (!st.ok()) {
      stats_.buffered_bytes -= before;
      Close(id, st.code() == StatusCode::kRefused ? CloseWhy::kOverCap : CloseWhy::kBadFormat, st.message());
      return;
    }
    stats_.buffered_bytes += c.decoder.buffered_bytes() - before;
    stats_.peak_buffered_bytes = std::max(stats_.peak_buffered_bytes, stats_.buffered_bytes);
    if (c.decoder.complete()) {
      complete_.push_back(id);
      return;  // no more from it until the owner took this one
    }
  }
}

void LocalServer::Write(Connection& c) {
  const uint64_t id = c.id;
  while (c.out_sent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Close(id, CloseWhy::kQuiet, Errno("send"));
      return;
    }
    c.out_sent += (size_t)n;
    stats_.reply_backlog_bytes -= (uint64_t)n;
    c.last_activity = options_.clock();
  }
  if (c.out_sent == c.out.size()) {
    c.out.clear();
    c.out_sent = 0;
    if (c.out.capacity() > (64u << 10)) c.out.shrink_to_fit();
  }
}

void LocalServer::CheckTimeouts(SteadyTime now) {
  std::vector<std::pair<uint64_t, std::string>> expired;
  for (const auto& [id, c] : connections_) {
    if (c.decoder.mid_message() && !c.decoder.complete() && MsSince(c.message_started, now) >= options_.message_timeout_ms) {
      expired.push_back({id, "sent " + std::to_string(c.decoder.buffered_bytes()) +
                                 (c.decoder.announced_bytes() ? " of " + std::to_string(c.decoder.announced_bytes()) : "") +
                                 " bytes of a request and did not finish it within " +
                                 std::to_string(options_.message_timeout_ms) + " ms"});
    } else if (MsSince(c.last_activity, now) >= options_.idle_timeout_ms) {
      expired.push_back({id, "idle for " + std::to_string(options_.idle_timeout_ms) + " ms"});
    }
  }
  for (const auto& [id, what] : expired) Close(id, CloseWhy::kTimeout, what);
}

void LocalServer::Close(uint64_t id, CloseWhy why, const std::string& what) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  const uint64_t held = c.decoder.failed() ? 0 : c.decoder.buffered_bytes();
  stats_.buffered_bytes -= held;
  stats_.reply_backlog_bytes -= c.out.size() - c.out_sent;
  uint64_t* count = nullptr;
  switch (why) {
    case CloseWhy::kQuiet: break;
    case CloseWhy::kOverCap: count = &stats_.closed_over_cap; break;
    case CloseWhy::kBadFormat: count = &stats_.closed_bad_format; break;
    case CloseWhy::kRejected: count = &stats_.closed_rejected; break;
    case CloseWhy::kTimeout: count = &stats_.closed_timeout; break;
    case CloseWhy::kEvicted: count = &stats_.closed_evicted; break;
    case CloseWhy::kBacklog: count = &stats_.closed_backlog; break;
    case CloseWhy::kMidMessage: count = &stats_.closed_mid_message; break;
  }
  if (count && LogThisOccurrence(++*count)) {
    NetLogf("net.local", "%s: closed the connection of %s: it %s (%llu such so far)", options_.name.c_str(),
            c.peer.ToString().c_str(), what.c_str(), (unsigned long long)*count);
  }
  ::close(c.fd);
  by_fd_.erase(c.fd);
  connections_.erase(it);
  stats_.connections = connections_.size();
}

bool LocalServer::Receive(LocalReceived* out) {
  while (!complete_.empty()) {
    const uint64_t id = complete_.front();
    complete_.pop_front();
    auto it = connections_.find(id);
    if (it == connections_.end() || !it->second.decoder.complete()) continue;
    Connection& c = it->second;
    stats_.buffered_bytes -= c.decoder.buffered_bytes();
    std::vector<std::vector<uint8_t>> frames = c.decoder.Take();
    out->connection = id;
    out->peer = c.peer;
    out->meta = {};
    out->message.Clear();
    for (auto& f : frames) out->message.AddOwned(std::move(f));
    const Status st = options_.validator(out->message, &out->meta);
    if (!st.ok()) {
      Close(id, CloseWhy::kRejected,
            "sent a request (" + std::to_string(out->message.size()) + " frames, " +
                std::to_string(out->message.bytes()) + " bytes) that failed its checks: " + st.message());
      continue;
    }
    c.requests_open++;
    stats_.received++;
    return true;
  }
  return false;
}

bool LocalServer::SendTo(uint64_t connection, const Message& message) {
  auto it = connections_.find(connection);
  if (it == connections_.end()) return false;
  Connection& c = it->second;
  const std::vector<std::span<const uint8_t>> frames = message.spans();
  const size_t before = c.out.size();
  if (Status st = EncodeStreamMessage(frames, options_.limits, &c.out); !st.ok()) {
    NetLogf("net.local", "%s: reply to %s not sent: %s", options_.name.c_str(), c.peer.ToString().c_str(),
            st.message().c_str());
    return false;
  }
  stats_.reply_backlog_bytes += c.out.size() - before;
  if (c.requests_open > 0) c.requests_open--;
  stats_.sent++;
  if (c.out.size() - c.out_sent > options_.max_reply_backlog_bytes) {
    Close(connection, CloseWhy::kBacklog,
          "did not read its replies (" + std::to_string(c.out.size() - c.out_sent) + " bytes waiting, " +
              std::to_string(options_.max_reply_backlog_bytes) + " allowed)");
    return false;
  }
  Write(c);
  return connections_.count(connection) > 0;
}

LocalServerStats LocalServer::stats() const { return stats_; }

// ---- LocalClient ----

Status LocalClient::Connect(const std::string& path, int timeout_ms, std::unique_ptr<LocalClient>* out,
                            const StreamFrameLimits& limits) {
  sockaddr_un addr;
  DL_RETURN_IF_ERROR(UnixAddress(path, &addr));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error(Errno("socket"));
  std::unique_ptr<LocalClient> c(new LocalClient(fd, path, limits));
  // A full listen backlog makes a blocking connect wait: bounded by the send timeout.
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  while (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno == EINTR) continue;
    return Status::Error("cannot connect to " + path + ": " + std::strerror(errno));
  }
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) return Status::Error(Errno("fcntl"));
  *out = std::move(c);
  return Status::Ok();
}

LocalClient::~LocalClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status LocalClient::WriteAll(std::span<const uint8_t> bytes, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes = bytes.subspan((size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd_, POLLOUT, deadline)) {
        return Status::Error(path_ + " took no more bytes within " + std::to_string(timeout_ms) + " ms");
      }
      continue;
    }
    return Status::Error("cannot write to " + path_ + ": " + std::strerror(errno) +
                         (errno == EPIPE || errno == ECONNRESET ? " (the server closed the connection)" : ""));
  }
  return Status::Ok();
}

Status LocalClient::Send(const Message& message, int timeout_ms) {
  std::vector<uint8_t> bytes;
  DL_RETURN_IF_ERROR(EncodeStreamMessage(message.spans(), limits_, &bytes));
  return WriteAll(bytes, timeout_ms);
}

Status LocalClient::Receive(Message* out, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<uint8_t> buf(64 << 10);
  while (!decoder_.complete()) {
    const size_t want = std::min(decoder_.wanted(), buf.size());
    if (want == 0) return Status::Error("the reply from " + path_ + " could not be read");
    const ssize_t n = ::read(fd_, buf.data(), want);
    if (n > 0) {
      size_t taken = 0;
      DL_RETURN_IF_ERROR(decoder_.Feed({buf.data(), (size_t)n}, &taken).WithContext("the reply from " + path_));
      continue;
    }
    if (n == 0) return Status::Error(path_ + " closed the connection before replying");
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return Status::Error(path_ + " closed the connection before replying (reset)");
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!WaitFor(fd_, POLLIN, deadline)) {
        return Status::Error("no reply from " + path_ + " within " + std::to_string(timeout_ms) + " ms");
      }
      continue;
    }
    return Status::Error("cannot read from " + path_ + ": " + std::strerror(errno));
  }
  out->Clear();
  for (auto& f : decoder_.Take()) out->AddOwned(std::move(f));
  return Status::Ok();
}

Status LocalCall(const std::string& path, const Message& request, int timeout_ms, Message* reply,
                 const StreamFrameLimits& limits) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_ptr<LocalClient> c;
  DL_RETURN_IF_ERROR(LocalClient::Connect(path, timeout_ms, &c, limits));
  DL_RETURN_IF_ERROR(c->Send(request, std::max(1, MsLeft(deadline))));
  return c->Receive(reply, std::max(1, MsLeft(deadline)));
}

}  // namespace diloco::net
