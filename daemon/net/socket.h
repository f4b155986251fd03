// RAII ZeroMQ sockets with the settings a long-running daemon needs, and whole-message send/receive.
//
// Every socket gets: a bounded ZMQ_LINGER, explicit send/receive HWMs, ZMQ_MAXMSGSIZE when it
// receives (per frame: a larger frame drops that connection), ZMQ_ROUTER_MANDATORY on ROUTERs
// (unroutable sends fail instead of vanishing), and a security decision per endpoint:
//   inproc://                  never leaves the process: always allowed;
//   ipc://, tcp:// loopback    CURVE, or plaintext when options.allow_plaintext is set;
//   tcp:// anything else       CURVE only (a wildcard bind such as tcp://*:port counts as remote).
// CURVE servers authenticate clients through the context's ZAP handler (zap.h) and the allowlist of
// their ZAP domain; handshake failures (e.g. a client holding a wrong server key) are counted and
// logged from a socket monitor, drained by the owner thread on every Send/Receive.
//
// One socket per thread: a Socket is used by one thread at a time (create it anywhere, hand it over
// once, e.g. when starting the thread). Messages are multipart and travel as a unit.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "daemon/net/chunk_frame.h"
#include "daemon/util/status.h"

namespace diloco::net {

class NetContext;
class Link;

// One ZeroMQ message: its frames, sent and received as one unit.
class Message {
 public:
  Message() = default;
  Message(Message&&) = default;
  Message& operator=(Message&&) = default;

  size_t size() const { return frames_.size(); }  // frames
  bool empty() const { return frames_.empty(); }
  size_t bytes() const;  // sum of the frame sizes

  std::span<const uint8_t> frame(size_t i) const {
    Complete();
    return {static_cast<const uint8_t*>(frames_[i].data()), frames_[i].size()};
  }
  std::string_view frame_view(size_t i) const {
    Complete();
    return {static_cast<const char*>(frames_[i].data()), frames_[i].size()};
  }
  // All frames as spans (valid while this Message lives and is not modified).
  std::vector<std::span<const uint8_t>> spans() const;

  void AddCopy(const void* data, size_t size) { frames_.emplace_back(data, size); }
  void AddCopy(std::string_view s) { frames_.emplace_back(s.data(), s.size()); }
  // Zero-copy: ZeroMQ takes the vector and frees it when the bytes are on the wire.
  void AddOwned(std::vector<uint8_t>&& buffer);
  // Zero-copy: sends [data, data+size), keeping owner alive until ZeroMQ is done with it
  // (owner's bytes must not change meanwhile).
  void AddShared(std::shared_ptr<const void> owner, const void* data, size_t size);
  void AddFrame(zmq::message_t&& frame) { frames_.push_back(std::move(frame)); }
  void PushFrontCopy(std::string_view s);
  zmq::message_t PopFront();

  // A peer-reported property of the received message ("Peer-Address", "User-Id" = the sender's
  // CURVE key when ZAP admitted it); empty when unknown or not received from a socket.
  std::string Property(const char* name) const;

  std::vector<zmq::message_t>& frames() {
    Complete();
    return frames_;
  }
  const std::vector<zmq::message_t>& frames() const {
    Complete();
    return frames_;
  }
  // The frames as they are, frame 0 possibly without its payload CRC (chunk_info()->crc_pending):
  // for the sender that completes it while sending (PubChannel).
  std::vector<zmq::message_t>& frames_as_is() { return frames_; }
  // Writes a pending payload CRC32C into frame 0 (one pass over the payload); a no-op otherwise.
  // Every accessor of the frames calls it, so nothing reads an incomplete header. Const: the
  // message's content is the same before and after, it is only written out.
  void Complete() const;
  void Clear() {
    frames_.clear();
    chunk_info_.reset();
  }

  // A wire message's payload frames (1..n): who sends them and their CRC32Cs (chunk_frame.h).
  // Set by ToMessage (PubChannel then sends the chunked form) and by the receiving channel's
  // chunk assembler (CRCs it computed over the received bytes); null otherwise.
  const std::shared_ptr<const ChunkInfo>& chunk_info() const { return chunk_info_; }
  void set_chunk_info(std::shared_ptr<const ChunkInfo> info) { chunk_info_ = std::move(info); }

 private:
  mutable std::vector<zmq::message_t> frames_;
  mutable std::shared_ptr<const ChunkInfo> chunk_info_;
};

enum class SocketType { kPub, kSub, kXPub, kXSub, kRouter, kDealer, kPush, kPull, kPair };
const char* SocketTypeName(SocketType type);

struct CurveOptions {
  std::string public_key_z85;  // this socket's key pair (curve.h: LoadCurveKeyPair)
  std::string secret_key_z85;
  // Server: authenticates clients against the allowlist of zap_domain (NetContext::SetAllowlist).
  bool server = false;
  std::string zap_domain = "dilocod";
  // Client: the public key of the server it connects to.
  std::string server_public_key_z85;
};

// The uplink's queues (learner PUB, syncer SUB), in messages: a delta of n 4 MiB chunks is n + 1
// messages, and PUB drops what does not fit, so they hold many deltas of the largest models.
inline constexpr int kUplinkHwmMsgs = 100000;

struct SocketOptions {
  std::string name = "socket";  // in log lines and errors, e.g. "syncer.uplink"
  int linger_ms = 1000;         // at close, unsent messages are kept at most this long
  int send_hwm_msgs = 1000;     // queued outgoing messages per peer; PUB drops beyond, others block
  int recv_hwm_msgs = 1000;     // queued incoming messages per peer
  // Receivers only (ZMQ_MAXMSGSIZE): a larger frame drops the connection. Deltas are chunked at
  // <= 4 MiB, so the default leaves room; -1 turns the limit off (benchmarks only).
  int64_t max_frame_bytes = int64_t{8} << 20;
  int sndbuf_bytes = 0;  // kernel socket buffers; 0: the OS default
  int rcvbuf_bytes = 0;
  int reconnect_ivl_ms = 100;       // first reconnect attempt after a drop
  int reconnect_ivl_max_ms = 2000;  // exponential backoff cap
  // ZMTP keepalive pings (0: off); a connection silent for zmtp_timeout_ms is closed and retried.
  int zmtp_heartbeat_ivl_ms = 0;
  int zmtp_heartbeat_timeout_ms = 0;
  std::string routing_id;  // DEALER: the identity its ROUTER sees (empty: a random one)
  // Plaintext on ipc:// and tcp loopback only, for local mode and tests; must be set explicitly.
  bool allow_plaintext = false;
  std::optional<CurveOptions> curve;
  // Emulated WAN link (link_shaper.h): Connect() goes through it. PUB, SUB, DEALER and PUSH only.
  std::shared_ptr<Link> link;
};

// Pure: whether endpoint may be used with these security options (see the table on top).
Status CheckEndpointSecurity(const std::string& endpoint, const SocketOptions& options);
// True for tcp://127.x.y.z:..., tcp://localhost:..., tcp://[::1]:....
bool IsLoopbackTcp(const std::string& endpoint);

enum class SendResult {
  kSent,
  kWouldBlock,  // timeout: HWM reached (nothing was sent; the message is unchanged)
  kUnroutable,  // ROUTER: no connected peer with that routing id
  kClosed,      // the context is shutting down, or the socket cannot send
};
enum class RecvResult { kMessage, kTimeout, kClosed };
const char* ToString(SendResult r);
const char* ToString(RecvResult r);

struct SocketStats {
  uint64_t handshake_failures = 0;  // CURVE handshakes that failed (wrong keys, garbage)
  // Of which: refused by ZAP (server side), or refused by the server (client side). libzmq 4.3
  // does not retry a refused connection: Connect again (or recreate the socket) to retry.
  uint64_t auth_failures = 0;
};

class Socket {
 public:
  static Status Create(NetContext& context, SocketType type, const SocketOptions& options,
                       std::unique_ptr<Socket>* out);
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // "tcp://127.0.0.1:*" binds a free port; endpoint() then tells which.
  Status Bind(const std::string& endpoint);
  // Through options.link when set.
  Status Connect(const std::string& endpoint);
  Status Disconnect(const std::string& endpoint);
  // The last endpoint bound or connected (resolved: tcp://127.0.0.1:41234).
  std::string endpoint() const;

  Status Subscribe(std::string_view prefix);  // SUB and XSUB only
  Status Unsubscribe(std::string_view prefix);

  // Sends msg as one message. timeout_ms: -1 waits forever, 0 never waits. On kSent msg is empty;
  // otherwise it is unchanged (retry, or drop it).
  SendResult Send(Message& msg, int timeout_ms = -1);
  // Receives one whole message into out (cleared first). timeout_ms as for Send.
  RecvResult Receive(Message* out, int timeout_ms);

  // Counts and logs monitor events (CURVE handshake failures). Send and Receive call it.
  void DrainEvents();
  SocketStats stats() const { return stats_; }

  SocketType type() const { return type_; }
  const SocketOptions& options() const { return options_; }
  zmq::socket_ref ref() { return socket_; }
  NetContext& context() { return context_; }

 private:
  Socket(NetContext& context, SocketType type, const SocketOptions& options);
  Status Configure();

  NetContext& context_;
  SocketType type_;
  SocketOptions options_;
  zmq::socket_t socket_;
  std::unique_ptr<zmq::socket_t> monitor_;  // PAIR receiving this socket's handshake events
  std::string endpoint_;
  SocketStats stats_;
};

// Waits until at least one socket can be read (or timeout_ms passes; -1: forever). ready[i] tells
// which. Returns false on timeout or when the context is shutting down.
bool PollReadable(std::span<Socket* const> sockets, int timeout_ms, std::vector<bool>* ready);

// A plain file descriptor polled beside ZeroMQ sockets (local_socket.h's server): events is
// ZMQ_POLLIN and/or ZMQ_POLLOUT; revents says which came, plus ZMQ_POLLERR for an error or a
// hang-up.
struct PollFd {
  int fd = -1;
  short events = 0;
  short revents = 0;
};
// The same with fds: true when a socket is readable or an fd has an event (fds[i].revents; all
// 0 on a timeout). One poll for both, so a loop serving both stays one loop.
bool PollReadable(std::span<Socket* const> sockets, std::span<PollFd> fds, int timeout_ms, std::vector<bool>* ready);

}  // namespace diloco::net
