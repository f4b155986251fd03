#include "daemon/net/channel.h"

#include <algorithm>

#include "daemon/net/net_log.h"
#include "daemon/util/crc32c.h"

namespace diloco::net {
namespace {

using Clock = std::chrono::steady_clock;

std::string Printable(std::string_view s, size_t max = 32) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 32 && c < 127) {
      out += static_cast<char>(c);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

ChunkAssemblerOptions AssemblerOptions(const ReceiveOptions& o) {
  ChunkAssemblerOptions a;
  a.max_payload_bytes = o.max_message_bytes;
  a.max_chunks = static_cast<uint32_t>(std::min<size_t>(o.max_frames > 0 ? o.max_frames - 1 : 0, UINT32_MAX));
  a.max_streams = o.max_chunked_messages;
  a.timeout_ms = o.chunk_timeout_ms;
  a.max_total_bytes = o.max_chunked_bytes;
  return a;
}

}  // namespace

ChannelBase::ChannelBase(std::unique_ptr<Socket> socket, ReceiveOptions options)
    : socket_(std::move(socket)), options_(std::move(options)), chunks_(AssemblerOptions(options_)) {
  if (options_.liveness) liveness_ = std::make_unique<LivenessTracker>(*options_.liveness);
  if (!options_.clock) options_.clock = [] { return Clock::now(); };
}

ChannelBase::~ChannelBase() = default;

ChannelStats ChannelBase::stats() const {
  ChannelStats s;
  s.received = stats_.received;
  s.received_bytes = stats_.received_bytes;
  s.rejected = stats_.rejected;
  s.duplicates = stats_.duplicates;
  s.gaps = stats_.gaps;
  s.missed = stats_.missed;
  s.restarts = stats_.restarts;
  s.sent = stats_.sent;
  s.sent_bytes = stats_.sent_bytes;
  s.send_failures = stats_.send_failures;
  return s;
}

std::vector<PeerChange> ChannelBase::TakeLivenessChanges(SteadyTime now) {
  std::vector<PeerChange> out;
  out.swap(pending_changes_);
  if (liveness_) {
    for (PeerChange& c : liveness_->Check(now)) {
      NetLogf("net.channel", "%s: peer %s is %s: %s", socket_->options().name.c_str(), c.peer.c_str(),
              ToString(c.state), c.reason.c_str());
      out.push_back(std::move(c));
    }
  }
  return out;
}

namespace {

// The peer's address, routing id and CURVE key, as far as known.
std::string From(const Message& m, const std::string& peer) {
  std::string from = m.Property("Peer-Address");
  const std::string key = m.Property("User-Id");
  if (!peer.empty()) {
    if (!from.empty()) from.append(" ");
    from.append("id ").append(Printable(peer));
  }
  if (!key.empty()) from.append(" key ").append(key);
  return from;
}

}  // namespace

void ChannelBase::CountReject(const std::string& what, const std::string& from, const std::string& why) {
  const uint64_t n = ++stats_.rejected;
  if (!LogThisOccurrence(n)) return;
  NetLogf("net.channel", "%s: rejected %s from %s: %s (%llu rejected so far)", socket_->options().name.c_str(),
          what.c_str(), from.empty() ? "unknown peer" : from.c_str(), why.c_str(),
          static_cast<unsigned long long>(n));
}

void ChannelBase::Reject(const Message& m, const std::string& peer, const std::string& why) {
  CountReject("message (" + std::to_string(m.size()) + " frames, " + std::to_string(m.bytes()) + " bytes)",
              From(m, peer), why);
}

bool ChannelBase::Assemble(const std::string& stream, const std::string& peer, Message* m) {
  const std::string from = From(*m, peer);
  ChunkAssembler::Result r = chunks_.Add(stream, std::move(*m), options_.clock());
  for (const std::string& why : r.dropped) CountReject("chunked message", from, why);
  if (!r.complete()) return false;
  *m = std::move(r.message);
  return true;
}

RecvResult ChannelBase::ReceiveValid(Received* out, int timeout_ms, size_t envelope_frames) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : 0);
  for (;;) {
    int wait = timeout_ms;
    if (timeout_ms > 0) {
      const int64_t left_us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
      wait = left_us <= 0 ? 0 : static_cast<int>((left_us + 999) / 1000);
    }
    for (const std::string& why : chunks_.Expire(options_.clock())) CountReject("chunked message", "", why);
    Message m;
    const RecvResult r = socket_->Receive(&m, wait);
    if (r != RecvResult::kMessage) return r;

    size_t bytes = m.bytes();
    std::string head;
    if (envelope_frames > 0 && !m.empty()) head = std::string(m.frame_view(0));
    // The chunked form: [framing][chunk frame][data]; whole messages continue below.
    bool assembled = false;
    if (m.size() == envelope_frames + 2 && LooksLikeChunkFrame(m.frame(envelope_frames))) {
      zmq::message_t first;
      if (envelope_frames > 0) first = m.PopFront();
      if (!Assemble(head, socket_->type() == SocketType::kRouter ? head : "", &m)) {
        if (timeout_ms == 0) return RecvResult::kTimeout;
        if (timeout_ms > 0 && Clock::now() >= deadline) return RecvResult::kTimeout;
        continue;
      }
      if (envelope_frames > 0) m.frames().insert(m.frames().begin(), std::move(first));
      bytes = m.bytes();
      assembled = true;
    }
    if (m.size() <= envelope_frames) {
      Reject(m, head, "no frames after the transport framing");
    } else if (m.size() - envelope_frames > options_.max_frames) {
      Reject(m, head, std::to_string(m.size()) + " frames (limit " + std::to_string(options_.max_frames) + ")");
    } else if (bytes > options_.max_message_bytes) {
      Reject(m, head, std::to_string(bytes) + " bytes (limit " + std::to_string(options_.max_message_bytes) + ")");
    } else {
      Received rec;
      rec.peer_key = m.Property("User-Id");
      if (envelope_frames > 0) {
        zmq::message_t first = m.PopFront();
        if (socket_->type() == SocketType::kRouter) {
          rec.peer = first.to_string();
        } else {
          rec.topic = first.to_string();
        }
      }
      Status st = options_.validator ? options_.validator(m, &rec.meta)
                                     : Status::Error("no validator configured for this channel");
      if (st.ok() && assembled) {
        // The chunk frames named the stream; the verified envelope must be the same message.
        const ChunkInfo& c = *m.chunk_info();
        if (c.sender != rec.meta.sender || c.incarnation != rec.meta.epoch || c.seq != rec.meta.seq) {
          st = Status::Error("chunks of seq " + std::to_string(c.seq) + " from " + c.sender +
                             " sealed by the envelope of seq " + std::to_string(rec.meta.seq) + " from " +
                             rec.meta.sender + " (or another incarnation)");
        }
      }
      if (!st.ok()) {
        Reject(m, rec.peer, st.message());
        if (timeout_ms == 0) return RecvResult::kTimeout;
        if (timeout_ms > 0 && Clock::now() >= deadline) return RecvResult::kTimeout;
        continue;
      }
      if (options_.track_sequence && rec.meta.sequenced) {
        const std::string key =
            options_.sequence_per_topic ? rec.topic + std::string(1, '\0') + rec.meta.sender : rec.meta.sender;
        rec.seq = sequence_.Observe(key, rec.meta.epoch, rec.meta.seq);
        switch (rec.seq.verdict) {
          case SeqVerdict::kDuplicate: ++stats_.duplicates; break;
          case SeqVerdict::kGap:
            ++stats_.gaps;
            stats_.missed += rec.seq.missed;
            if (LogThisOccurrence(stats_.gaps)) {
              NetLogf("net.channel", "%s: gap from %s: %llu message(s) lost before seq %llu (%llu gaps so far)",
                      socket_->options().name.c_str(), rec.meta.sender.c_str(),
                      static_cast<unsigned long long>(rec.seq.missed), static_cast<unsigned long long>(rec.meta.seq),
                      static_cast<unsigned long long>(stats_.gaps.load()));
            }
            break;
          case SeqVerdict::kRestart: ++stats_.restarts; break;
          default: break;
        }
      } else {
        rec.seq = {SeqVerdict::kInOrder, 0};
      }
      if (liveness_ && !rec.meta.sender.empty()) {
        if (auto change = liveness_->Heard(rec.meta.sender, options_.clock())) {
          if (change->reason != "first heartbeat") {
            NetLogf("net.channel", "%s: peer %s is alive: %s", socket_->options().name.c_str(),
                    change->peer.c_str(), change->reason.c_str());
          }
          pending_changes_.push_back(std::move(*change));
        }
      }
      if (rec.seq.verdict != SeqVerdict::kDuplicate) {
        ++stats_.received;
        stats_.received_bytes += bytes;
        rec.message = std::move(m);
        *out = std::move(rec);
        return RecvResult::kMessage;
      }
    }
    if (timeout_ms == 0) return RecvResult::kTimeout;
    if (timeout_ms > 0 && Clock::now() >= deadline) return RecvResult::kTimeout;
  }
}

SendResult ChannelBase::CountSend(SendResult r, size_t bytes) {
  if (r == SendResult::kSent) {
    ++stats_.sent;
    stats_.sent_bytes += bytes;
  } else {
    const uint64_t n = ++stats_.send_failures;
    if (LogThisOccurrence(n)) {
      NetLogf("net.channel", "%s: send failed: %s (%llu failures so far)", socket_->options().name.c_str(),
              ToString(r), static_cast<unsigned long long>(n));
    }
  }
  return r;
}

Status PubChannel::Create(NetContext& context, const SocketOptions& options, std::unique_ptr<PubChannel>* out) {
  std::unique_ptr<Socket> s;
  DL_RETURN_IF_ERROR(Socket::Create(context, SocketType::kPub, options, &s));
  out->reset(new PubChannel(std::move(s), ReceiveOptions{}));
  return Status::Ok();
}

SendResult PubChannel::Publish(std::string_view topic, Message& message) {
  const auto& info = message.chunk_info();
  if (send_chunked_ && info && message.size() >= 2 && (info->crc_pending || info->crc32c.size() + 1 == message.size())) {
    return PublishChunked(topic, message);
  }
  message.PushFrontCopy(topic);
  const size_t bytes = message.bytes();
  const SendResult r = socket_->Send(message, 0);
  if (r != SendResult::kSent) message.PopFront();  // hand the message back as it came
  return CountSend(r, bytes);
}

SendResult PubChannel::PublishChunked(std::string_view topic, Message& message) {
  const std::shared_ptr<const ChunkInfo> keep = message.chunk_info();
  const ChunkInfo& info = *keep;
  std::vector<zmq::message_t>& frames = message.frames_as_is();
  const auto count = static_cast<uint32_t>(frames.size() - 1);
  Crc32cJoiner joined;  // the payload CRC, when the header still lacks it
  ChunkFrame f;
  f.sender = info.sender;
  f.incarnation = info.incarnation;
  f.seq = info.seq;
  f.count = count;
  f.payload_bytes = info.payload_bytes;
  size_t bytes = 0;
  // Chunks first, the header last: each chunk leaves as soon as it is queued. The frames are
  // shared (reference counts), so a failure leaves message as it came.
  for (uint32_t k = 0; k <= count; ++k) {
    f.kind = k < count ? ChunkKind::kChunk : ChunkKind::kSeal;
    f.index = k;
    f.crc32c = 0;
    if (k < count && info.crc_pending) {
      // While chunk k-1 is on its way: the CRC of the bytes in this chunk, which the header needs.
      f.crc32c = Crc32c(frames[k + 1].data(), frames[k + 1].size());
      joined.Add(f.crc32c, frames[k + 1].size());
    } else if (k < count) {
      f.crc32c = info.crc32c[k];
    }
    if (k == count && info.crc_pending) {
      info.seal({static_cast<uint8_t*>(frames[0].data()), frames[0].size()}, joined.crc());
    }
    Message part;
    part.AddCopy(topic);
    part.AddOwned(EncodeChunkFrame(f));
    zmq::message_t share;
    share.copy(frames[k < count ? k + 1 : 0]);
    part.AddFrame(std::move(share));
    bytes += part.bytes();
    const SendResult r = socket_->Send(part, 0);
    if (r != SendResult::kSent) return CountSend(r, bytes);
  }
  message.Clear();
  return CountSend(SendResult::kSent, bytes);
}

Status SubChannel::Create(NetContext& context, const SocketOptions& options, ReceiveOptions receive,
                          std::unique_ptr<SubChannel>* out) {
  if (!receive.validator) return Status::Error(options.name + ": a SubChannel needs a validator");
  std::unique_ptr<Socket> s;
  DL_RETURN_IF_ERROR(Socket::Create(context, SocketType::kSub, options, &s));
  out->reset(new SubChannel(std::move(s), std::move(receive)));
  return Status::Ok();
}

Status RouterChannel::Create(NetContext& context, const SocketOptions& options, ReceiveOptions receive,
                             std::unique_ptr<RouterChannel>* out) {
  if (!receive.validator) return Status::Error(options.name + ": a RouterChannel needs a validator");
  std::unique_ptr<Socket> s;
  DL_RETURN_IF_ERROR(Socket::Create(context, SocketType::kRouter, options, &s));
  out->reset(new RouterChannel(std::move(s), std::move(receive)));
  return Status::Ok();
}

SendResult RouterChannel::SendTo(const std::string& peer, Message& message, int timeout_ms) {
  message.PushFrontCopy(peer);
  const size_t bytes = message.bytes();
  const SendResult r = socket_->Send(message, timeout_ms);
  if (r != SendResult::kSent) message.PopFront();
  return CountSend(r, bytes);
}

Status DealerChannel::Create(NetContext& context, const SocketOptions& options, ReceiveOptions receive,
                             std::unique_ptr<DealerChannel>* out) {
  if (!receive.validator) return Status::Error(options.name + ": a DealerChannel needs a validator");
  std::unique_ptr<Socket> s;
  DL_RETURN_IF_ERROR(Socket::Create(context, SocketType::kDealer, options, &s));
  out->reset(new DealerChannel(std::move(s), std::move(receive)));
  return Status::Ok();
}

SendResult DealerChannel::Send(Message& message, int timeout_ms) {
  const size_t bytes = message.bytes();
  return CountSend(socket_->Send(message, timeout_ms), bytes);
}

}  // namespace diloco::net
