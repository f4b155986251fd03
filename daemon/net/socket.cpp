#include "daemon/net/socket.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "daemon/net/context.h"
#include "daemon/net/curve.h"
#include "daemon/net/link_shaper.h"
#include "daemon/net/net_log.h"
#include "daemon/util/crc32c.h"

namespace diloco::net {
namespace {

zmq::socket_type ZmqType(SocketType t) {
  switch (t) {
    case SocketType::kPub: return zmq::socket_type::pub;
    case SocketType::kSub: return zmq::socket_type::sub;
    case SocketType::kXPub: return zmq::socket_type::xpub;
    case SocketType::kXSub: return zmq::socket_type::xsub;
    case SocketType::kRouter: return zmq::socket_type::router;
    case SocketType::kDealer: return zmq::socket_type::dealer;
    case SocketType::kPush: return zmq::socket_type::push;
    case SocketType::kPull: return zmq::socket_type::pull;
    case SocketType::kPair: return zmq::socket_type::pair;
  }
  return zmq::socket_type::pair;
}

bool CanSend(SocketType t) { return t != SocketType::kSub && t != SocketType::kPull; }

using Clock = std::chrono::steady_clock;

// Milliseconds until deadline, rounded up: a 1 ms wait really waits (0 only once it passed).
int RemainingMs(Clock::time_point deadline) {
  const auto left_us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
  return left_us <= 0 ? 0 : static_cast<int>((left_us + 999) / 1000);
}

const char* EventName(uint16_t event) {
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: return "handshake failed";
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL: return "handshake failed (protocol or cryptographic error)";
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: return "authentication refused";
    default: return "event";
  }
}

}  // namespace

// ---- Message ----

size_t Message::bytes() const {
  size_t n = 0;
  for (const auto& f : frames_) n += f.size();
  return n;
}

void Message::Complete() const {
  if (!chunk_info_ || !chunk_info_->crc_pending || frames_.empty()) return;
  auto done = std::make_shared<ChunkInfo>(*chunk_info_);
  done->crc_pending = false;
  done->crc32c.clear();
  Crc32cJoiner joined;
  for (size_t i = 1; i < frames_.size(); ++i) {
    done->crc32c.push_back(Crc32c(frames_[i].data(), frames_[i].size()));
    joined.Add(done->crc32c.back(), frames_[i].size());
  }
  done->seal({static_cast<uint8_t*>(frames_[0].data()), frames_[0].size()}, joined.crc());
  chunk_info_ = std::move(done);
}

std::vector<std::span<const uint8_t>> Message::spans() const {
  Complete();
  std::vector<std::span<const uint8_t>> out;
  out.reserve(frames_.size());
  for (size_t i = 0; i < frames_.size(); ++i) out.push_back(frame(i));
  return out;
}

void Message::AddOwned(std::vector<uint8_t>&& buffer) {
  if (buffer.size() <= 64) {  // small: a copy is cheaper than a heap handoff
    frames_.emplace_back(buffer.data(), buffer.size());
    return;
  }
  auto* owned = new std::vector<uint8_t>(std::move(buffer));
  frames_.emplace_back(
      owned->data(), owned->size(), [](void*, void* hint) { delete static_cast<std::vector<uint8_t>*>(hint); }, owned);
}

void Message::AddShared(std::shared_ptr<const void> owner, const void* data, size_t size) {
  if (size <= 64) {
    frames_.emplace_back(data, size);
    return;
  }
  auto* keep = new std::shared_ptr<const void>(std::move(owner));
  frames_.emplace_back(
      const_cast<void*>(data), size,
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }, keep);
}

void Message::PushFrontCopy(std::string_view s) {
  Complete();
  frames_.insert(frames_.begin(), zmq::message_t(s.data(), s.size()));
}

zmq::message_t Message::PopFront() {
  Complete();
  zmq::message_t f = std::move(frames_.front());
  frames_.erase(frames_.begin());
  return f;
}

std::string Message::Property(const char* name) const {
  if (frames_.empty()) return "";
  // The last frame: a ROUTER's routing-id frame carries no connection metadata.
  const char* v = zmq_msg_gets(const_cast<zmq_msg_t*>(frames_.back().handle()), name);
  return v ? v : "";
}

const char* SocketTypeName(SocketType type) {
  switch (type) {
    case SocketType::kPub: return "PUB";
    case SocketType::kSub: return "SUB";
    case SocketType::kXPub: return "XPUB";
    case SocketType::kXSub: return "XSUB";
    case SocketType::kRouter: return "ROUTER";
    case SocketType::kDealer: return "DEALER";
    case SocketType::kPush: return "PUSH";
    case SocketType::kPull: return "PULL";
    case SocketType::kPair: return "PAIR";
  }
  return "?";
}

const char* ToString(SendResult r) {
  switch (r) {
    case SendResult::kSent: return "sent";
    case SendResult::kWouldBlock: return "would block (high-water mark reached)";
    case SendResult::kUnroutable: return "unroutable (no such peer)";
    case SendResult::kClosed: return "closed";
  }
  return "?";
}

const char* ToString(RecvResult r) {
  switch (r) {
    case RecvResult::kMessage: return "message";
    case RecvResult::kTimeout: return "timeout";
    case RecvResult::kClosed: return "closed";
  }
  return "?";
}

// ---- security policy ----

bool IsLoopbackTcp(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  std::string rest = endpoint.substr(6);
  const size_t semi = rest.find(';');  // "tcp://src;dst": the destination decides
  if (semi != std::string::npos) rest = rest.substr(semi + 1);
  const size_t colon = rest.rfind(':');
  const std::string host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (host == "localhost" || host == "[::1]" || host == "::1") return true;
  if (host.rfind("127.", 0) == 0) {
    for (char c : host) {
      if (!(c == '.' || (c >= '0' && c <= '9'))) return false;
    }
    return true;
  }
  return false;
}

Status CheckEndpointSecurity(const std::string& endpoint, const SocketOptions& options) {
  const bool curve = options.curve.has_value();
  if (endpoint.rfind("inproc://", 0) == 0) return Status::Ok();
  if (endpoint.rfind("ipc://", 0) == 0) {
    if (curve || options.allow_plaintext) return Status::Ok();
    return Status::Error(options.name + ": " + endpoint +
                         " has no CURVE keys; configure keys, or set allow_plaintext for local ipc use");
  }
  if (endpoint.rfind("tcp://", 0) == 0) {
    if (curve) return Status::Ok();
    if (IsLoopbackTcp(endpoint)) {
      if (options.allow_plaintext) return Status::Ok();
      return Status::Error(options.name + ": " + endpoint +
                           " has no CURVE keys; configure keys, or set allow_plaintext for loopback tests");
    }
    return Status::Error(options.name + ": " + endpoint +
                         " is not a loopback address and the socket has no CURVE keys; plaintext is only allowed "
                         "on inproc, ipc and loopback: create keys with `dilococtl keygen` and configure them");
  }
  return Status::Error(options.name + ": unsupported endpoint " + endpoint + " (use tcp://, ipc:// or inproc://)");
}

// ---- Socket ----

Socket::Socket(NetContext& context, SocketType type, const SocketOptions& options)
    : context_(context), type_(type), options_(options), socket_(context.zmq(), ZmqType(type)) {}

Socket::~Socket() {
  if (monitor_) {
    try {
      zmq_socket_monitor(socket_.handle(), nullptr, 0);
    } catch (...) {
    }
    monitor_->close();
  }
  socket_.close();
}

Status Socket::Create(NetContext& context, SocketType type, const SocketOptions& options,
                      std::unique_ptr<Socket>* out) {
  if (options.linger_ms < 0) return Status::Error(options.name + ": linger_ms must be >= 0 (bounded)");
  if (options.send_hwm_msgs < 1 || options.recv_hwm_msgs < 1) {
    return Status::Error(options.name + ": HWMs must be at least 1 message (0 would mean unbounded)");
  }
  if (options.max_frame_bytes == 0 || options.max_frame_bytes < -1) {
    return Status::Error(options.name + ": max_frame_bytes must be positive, or -1 for no limit");
  }
  if (options.link && type != SocketType::kPub && type != SocketType::kSub && type != SocketType::kDealer &&
      type != SocketType::kPush) {
    return Status::Error(options.name + ": a link shaper supports PUB, SUB, DEALER and PUSH sockets, not " +
                         SocketTypeName(type));
  }
  try {
    std::unique_ptr<Socket> s(new Socket(context, type, options));
    DL_RETURN_IF_ERROR(s->Configure());
    *out = std::move(s);
  } catch (const zmq::error_t& e) {
    return Status::Error(options.name + ": cannot create a " + SocketTypeName(type) + " socket: " + e.what());
  }
  return Status::Ok();
}

Status Socket::Configure() {
  const SocketOptions& o = options_;
  socket_.set(zmq::sockopt::linger, o.linger_ms);
  socket_.set(zmq::sockopt::sndhwm, o.send_hwm_msgs);
  socket_.set(zmq::sockopt::rcvhwm, o.recv_hwm_msgs);
  socket_.set(zmq::sockopt::maxmsgsize, o.max_frame_bytes);
  if (o.sndbuf_bytes > 0) socket_.set(zmq::sockopt::sndbuf, o.sndbuf_bytes);
  if (o.rcvbuf_bytes > 0) socket_.set(zmq::sockopt::rcvbuf, o.rcvbuf_bytes);
  socket_.set(zmq::sockopt::reconnect_ivl, o.reconnect_ivl_ms);
  socket_.set(zmq::sockopt::reconnect_ivl_max, o.reconnect_ivl_max_ms);
  if (o.zmtp_heartbeat_ivl_ms > 0) {
    socket_.set(zmq::sockopt::heartbeat_ivl, o.zmtp_heartbeat_ivl_ms);
    socket_.set(zmq::sockopt::heartbeat_timeout,
                o.zmtp_heartbeat_timeout_ms > 0 ? o.zmtp_heartbeat_timeout_ms : 3 * o.zmtp_heartbeat_ivl_ms);
  }
  if (type_ == SocketType::kRouter) socket_.set(zmq::sockopt::router_mandatory, 1);
  if (!o.routing_id.empty()) socket_.set(zmq::sockopt::routing_id, o.routing_id);
  if (o.curve) {
    const CurveOptions& c = *o.curve;
    if (!CurveAvailable()) return Status::Error(o.name + ": libzmq was built without CURVE");
    DL_RETURN_IF_ERROR(ValidateZ85Key(c.secret_key_z85, "curve secret key").WithContext(o.name));
    DL_RETURN_IF_ERROR(ValidateZ85Key(c.public_key_z85, "curve public key").WithContext(o.name));
    if (c.server) {
      if (c.zap_domain.empty()) return Status::Error(o.name + ": a CURVE server needs a ZAP domain");
      // Without a ZAP handler libzmq would admit any client: start it first.
      DL_RETURN_IF_ERROR(context_.EnsureZap());
      socket_.set(zmq::sockopt::curve_server, 1);
      socket_.set(zmq::sockopt::curve_secretkey, c.secret_key_z85);
      socket_.set(zmq::sockopt::curve_publickey, c.public_key_z85);
      socket_.set(zmq::sockopt::zap_domain, c.zap_domain);
    } else {
      DL_RETURN_IF_ERROR(ValidateZ85Key(c.server_public_key_z85, "server public key").WithContext(o.name));
      socket_.set(zmq::sockopt::curve_serverkey, c.server_public_key_z85);
      socket_.set(zmq::sockopt::curve_publickey, c.public_key_z85);
      socket_.set(zmq::sockopt::curve_secretkey, c.secret_key_z85);
    }
    const std::string mon = "inproc://dl-monitor-" + std::to_string(context_.NextId());
    if (zmq_socket_monitor(socket_.handle(), mon.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
      return Status::Error(o.name + ": zmq_socket_monitor: " + zmq_strerror(errno));
    }
    monitor_ = std::make_unique<zmq::socket_t>(context_.zmq(), zmq::socket_type::pair);
    monitor_->set(zmq::sockopt::linger, 0);
    monitor_->connect(mon);
  }
  return Status::Ok();
}

Status Socket::Bind(const std::string& endpoint) {
  if (options_.link) return Status::Error(options_.name + ": a socket with a link shaper connects, it cannot bind");
  DL_RETURN_IF_ERROR(CheckEndpointSecurity(endpoint, options_));
  try {
    socket_.bind(endpoint);
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    const std::string message = options_.name + ": cannot bind " + endpoint + ": " + e.what();
    return e.num() == EADDRINUSE ? Status::AddressInUse(message) : Status::Error(message);
  }
  return Status::Ok();
}

Status Socket::Connect(const std::string& endpoint) {
  try {
    if (options_.link) {
      std::string relay_endpoint;
      DL_RETURN_IF_ERROR(options_.link->Attach(type_, options_, endpoint, &relay_endpoint));
      socket_.connect(relay_endpoint);
      endpoint_ = endpoint;
      return Status::Ok();
    }
    DL_RETURN_IF_ERROR(CheckEndpointSecurity(endpoint, options_));
    socket_.connect(endpoint);
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::Error(options_.name + ": cannot connect to " + endpoint + ": " + e.what());
  }
  return Status::Ok();
}

Status Socket::Disconnect(const std::string& endpoint) {
  if (options_.link) return Status::Error(options_.name + ": Disconnect is not supported through a link shaper");
  try {
    socket_.disconnect(endpoint);
  } catch (const zmq::error_t& e) {
    return Status::Error(options_.name + ": cannot disconnect " + endpoint + ": " + e.what());
  }
  return Status::Ok();
}

std::string Socket::endpoint() const { return endpoint_; }

Status Socket::Subscribe(std::string_view prefix) {
  if (type_ != SocketType::kSub && type_ != SocketType::kXSub) {
    return Status::Error(options_.name + ": Subscribe needs a SUB socket");
  }
  try {
    if (type_ == SocketType::kSub) {
      socket_.set(zmq::sockopt::subscribe, prefix);
    } else {
      std::string m(1, '\x01');
      m.append(prefix);
      socket_.send(zmq::buffer(m), zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    return Status::Error(options_.name + ": subscribe: " + e.what());
  }
  return Status::Ok();
}

Status Socket::Unsubscribe(std::string_view prefix) {
  if (type_ != SocketType::kSub) return Status::Error(options_.name + ": Unsubscribe needs a SUB socket");
  try {
    socket_.set(zmq::sockopt::unsubscribe, prefix);
  } catch (const zmq::error_t& e) {
    return Status::Error(options_.name + ": unsubscribe: " + e.what());
  }
  return Status::Ok();
}

SendResult Socket::Send(Message& msg, int timeout_ms) {
  DrainEvents();
  if (msg.empty() || !CanSend(type_)) {
    NetLogf("net.socket", "%s: cannot send %s", options_.name.c_str(),
            msg.empty() ? "a message without frames" : "on this socket type");
    return SendResult::kClosed;
  }
  auto& frames = msg.frames();
  const size_t n = frames.size();
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : 0);
  try {
    // Only the first frame can fail: once it is queued, ZeroMQ accepts the rest of the message.
    const zmq::send_flags more = n > 1 ? zmq::send_flags::sndmore : zmq::send_flags::none;
    for (;;) {
      if (timeout_ms < 0) {
        socket_.send(frames[0], more);
        break;
      }
      if (socket_.send(frames[0], more | zmq::send_flags::dontwait)) break;
      const int left = RemainingMs(deadline);
      if (left <= 0) return SendResult::kWouldBlock;
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLOUT, 0};
      const auto before = Clock::now();
      zmq::poll(&item, 1, std::chrono::milliseconds(left));
      // Some types (ROUTER) always poll writable; do not spin.
      if (Clock::now() - before < std::chrono::microseconds(200)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (size_t i = 1; i < n; ++i) {
      socket_.send(frames[i], i + 1 < n ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return SendResult::kUnroutable;
    if (e.num() != ETERM) NetLogf("net.socket", "%s: send failed: %s", options_.name.c_str(), e.what());
    return SendResult::kClosed;
  }
  msg.Clear();
  return SendResult::kSent;
}

RecvResult Socket::Receive(Message* out, int timeout_ms) {
  DrainEvents();
  out->Clear();
  try {
    zmq::message_t frame;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : 0);
    // zmq_poll may report a socket readable when it only processed commands (a peer attaching,
    // a handshake): poll again until a frame is there or the deadline passes.
    while (!socket_.recv(frame, zmq::recv_flags::dontwait)) {
      if (timeout_ms == 0) return RecvResult::kTimeout;
      const int left = timeout_ms < 0 ? -1 : RemainingMs(deadline);
      if (left == 0) return RecvResult::kTimeout;
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(left));
    }
    bool more = frame.more();
    out->AddFrame(std::move(frame));
    while (more) {
      zmq::message_t next;
      (void)socket_.recv(next, zmq::recv_flags::none);  // the rest of a message is already here
      more = next.more();
      out->AddFrame(std::move(next));
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != ETERM) NetLogf("net.socket", "%s: receive failed: %s", options_.name.c_str(), e.what());
    out->Clear();
    return RecvResult::kClosed;
  }
  return RecvResult::kMessage;
}

void Socket::DrainEvents() {
  if (!monitor_) return;
  try {
    for (;;) {
      zmq::message_t ev, addr;
      if (!monitor_->recv(ev, zmq::recv_flags::dontwait)) return;
      if (ev.more()) (void)monitor_->recv(addr, zmq::recv_flags::none);
      if (ev.size() < 6) continue;
      uint16_t event;
      uint32_t value;
      std::memcpy(&event, ev.data(), 2);
      std::memcpy(&value, static_cast<const char*>(ev.data()) + 2, 4);
      ++stats_.handshake_failures;
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) ++stats_.auth_failures;
      if (LogThisOccurrence(stats_.handshake_failures)) {
        NetLogf("net.socket", "%s: %s on %s (code %u; %llu so far)", options_.name.c_str(), EventName(event),
                addr.to_string().c_str(), value, static_cast<unsigned long long>(stats_.handshake_failures));
      }
    }
  } catch (const zmq::error_t&) {
  }
}

bool PollReadable(std::span<Socket* const> sockets, int timeout_ms, std::vector<bool>* ready) {
  return PollReadable(sockets, {}, timeout_ms, ready);
}

bool PollReadable(std::span<Socket* const> sockets, std::span<PollFd> fds, int timeout_ms, std::vector<bool>* ready) {
  std::vector<zmq::pollitem_t> items;
  items.reserve(sockets.size() + fds.size());
  for (Socket* s : sockets) items.push_back({s->ref().handle(), 0, ZMQ_POLLIN, 0});
  for (const PollFd& f : fds) items.push_back({nullptr, f.fd, f.events, 0});
  ready->assign(sockets.size(), false);
  for (PollFd& f : fds) f.revents = 0;
  try {
    if (zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms)) <= 0) return false;
  } catch (const zmq::error_t&) {
    return false;
  }
  for (size_t i = 0; i < sockets.size(); ++i) (*ready)[i] = (items[i].revents & ZMQ_POLLIN) != 0;
  for (size_t i = 0; i < fds.size(); ++i) fds[i].revents = items[sockets.size() + i].revents;
  return true;
}

}  // namespace diloco::net
