// The local control socket: an AF_UNIX stream server and its client, speaking stream_frames.h
// (length-prefixed multipart messages), so that what a local client can make the daemon hold is
// bounded by rules this project owns (libzmq's ipc:// bounds a frame, not a message):
//   - a request's size is checked from its prefix before any of it is taken in; over
//     limits.max_message_bytes, or any bytes that break the format, close the connection;
//   - a connection holds at most one request at a time (the server reads no further than the
//     request's end until the owner has taken it), so all requests held together never exceed
//     limits.max_message_bytes x max_connections (stats().buffered_bytes);
//   - at most max_connections at once: one more closes the one idle longest (those waiting on a
//     reply go last);
//   - a request not complete message_timeout_ms after its first byte, or a connection silent
//     for idle_timeout_ms, is closed: a half-sent request cannot hold a slot;
//   - every request runs through options.validator (the wire's envelope checks) before the owner
//     sees it; a rejected one closes its connection;
//   - replies wait in a bounded backlog for a client that does not read them.
// Each connection closed for breaking a rule is logged (net.local) with the peer's pid and uid
// (SO_PEERCRED) and what it did (1st, 2nd, 4th, ... of each kind).
//
// The server never blocks: its owner polls its fds together with ZeroMQ sockets (socket.h's
// PollReadable with fds) and calls Service after each poll. One thread uses a server.
//
// The client (LocalClient, LocalCall) is blocking, with a deadline for the whole exchange.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/net/channel.h"
#include "daemon/net/socket.h"
#include "daemon/net/stream_frames.h"
#include "daemon/util/status.h"

namespace diloco::net {

// Who is at the other end of a local connection (SO_PEERCRED; -1 when unknown).
struct PeerCred {
  int pid = -1;
  int uid = -1;
  int gid = -1;
  std::string ToString() const;  // "pid 1234 uid 1000"
};

struct LocalServerOptions {
  std::string name = "control.local";  // in log lines
  StreamFrameLimits limits;            // per request; the same cap bounds each reply
  size_t max_connections = 32;
  int message_timeout_ms = 5000;   // from a request's first byte to its last
  int idle_timeout_ms = 60000;     // nothing read or written for this long (replies that take
                                   // longer than this to come are lost with their connection)
  uint64_t max_reply_backlog_bytes = uint64_t{8} << 20;  // replies a client has not read yet
  uint64_t read_budget_bytes = uint64_t{1} << 20;        // per connection and Service: fairness
  Validator validator;                                   // required
  std::function<SteadyTime()> clock = [] { return std::chrono::steady_clock::now(); };
};

struct LocalServerStats {
  uint64_t accepted = 0;
  uint64_t received = 0;  // valid requests handed to the owner
  uint64_t sent = 0;      // replies queued
  // Connections closed, by why.
  uint64_t closed_over_cap = 0;     // announced a request over limits.max_message_bytes
  uint64_t closed_bad_format = 0;   // bytes that are not a request (garbage, bad frame count)
  uint64_t closed_rejected = 0;     // a whole request the validator refused
  uint64_t closed_timeout = 0;      // message_timeout_ms or idle_timeout_ms passed
  uint64_t closed_evicted = 0;      // closed to make room (max_connections)
  uint64_t closed_backlog = 0;      // did not read its replies
  uint64_t closed_mid_message = 0;  // hung up inside a request
  size_t connections = 0;           // open now
  uint64_t buffered_bytes = 0;      // request bytes held now, all connections
  uint64_t peak_buffered_bytes = 0;
  uint64_t reply_backlog_bytes = 0;  // reply bytes not yet written, all connections
};

struct LocalReceived {
  uint64_t connection = 0;  // for SendTo
  PeerCred peer;
  MessageMeta meta;  // what the validator said
  Message message;
};

class LocalServer {
 public:
  // Listens on path (which must not exist: the owner removes a stale file first).
  static Status Create(const std::string& path, LocalServerOptions options, std::unique_ptr<LocalServer>* out);
  // Closes every connection; removes the socket file when it is still the one it bound.
  ~LocalServer();
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;

  // Appends the fds to poll: the listening socket, and each connection (readable while it may
  // send, writable while a reply waits).
  void AddPollFds(std::vector<PollFd>* fds) const;
  // After a poll (fds as the poll returned them; fds that are not this server's are skipped):
  // accepts, reads and writes what is ready, and closes connections past their timeouts (call it
  // every loop turn, even when the poll found nothing).
  void Service(std::span<const PollFd> fds);
  // The next valid request; false when none is waiting.
  bool Receive(LocalReceived* out);
  // Queues message to connection and writes what the socket takes now. false when the connection
  // is gone, the message is over the cap, or the client's backlog is full (it is closed).
  bool SendTo(uint64_t connection, const Message& message);

  LocalServerStats stats() const;
  const std::string& path() const { return path_; }
  int listen_fd() const { return listen_fd_; }

 private:
  struct Connection {
    uint64_t id = 0;
    int fd = -1;
    PeerCred peer;
    StreamDecoder decoder;
    SteadyTime last_activity;
    SteadyTime message_started;  // first byte of the request being read
    std::vector<uint8_t> out;    // reply bytes; out_sent of them written
    size_t out_sent = 0;
    uint64_t requests_open = 0;  // handed to the owner, not answered yet
    explicit Connection(const StreamFrameLimits& limits) : decoder(limits) {}
  };
  enum class CloseWhy { kQuiet, kOverCap, kBadFormat, kRejected, kTimeout, kEvicted, kBacklog, kMidMessage };

  LocalServer(std::string path, LocalServerOptions options);
  void Accept();
  void Evict();
  void Read(Connection& c);
  void Write(Connection& c);
  void CheckTimeouts(SteadyTime now);
  void Close(uint64_t id, CloseWhy why, const std::string& what);

  std::string path_;
  LocalServerOptions options_;
  int listen_fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Connection> connections_;
  std::map<int, uint64_t> by_fd_;
  std::deque<uint64_t> complete_;  // connections holding a whole request, in arrival order
  std::vector<uint8_t> scratch_;
  LocalServerStats stats_;
};

// A blocking connection to a LocalServer.
class LocalClient {
 public:
  static Status Connect(const std::string& path, int timeout_ms, std::unique_ptr<LocalClient>* out,
                        const StreamFrameLimits& limits = {});
  ~LocalClient();
  LocalClient(const LocalClient&) = delete;
  LocalClient& operator=(const LocalClient&) = delete;

  // Writes all of bytes within timeout_ms (raw: tests send broken streams with it).
  Status WriteAll(std::span<const uint8_t> bytes, int timeout_ms);
  Status Send(const Message& message, int timeout_ms);
  // The next message; an error on timeout, on a closed connection or a reply over the limits.
  Status Receive(Message* out, int timeout_ms);
  int fd() const { return fd_; }

 private:
  LocalClient(int fd, std::string path, const StreamFrameLimits& limits) : fd_(fd), path_(std::move(path)), decoder_(limits), limits_(limits) {}
  int fd_;
  std::string path_;
  StreamDecoder decoder_;
  StreamFrameLimits limits_;
};

// One request to the server at path and its reply, within timeout_ms.
Status LocalCall(const std::string& path, const Message& request, int timeout_ms, Message* reply,
                 const StreamFrameLimits& limits = {});

}  // namespace diloco::net
