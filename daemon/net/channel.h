// Channels: sockets with the receive path every data link of dilocod needs.
//
//   learner PubChannel  --> syncer SubChannel     Delta, Heartbeat
//   syncer  PubChannel  --> learner SubChannel    Global, SyncerStatus
//   learner DealerChannel <-> syncer RouterChannel  snapshot request / reply (Clone pattern, clone.h)
//
// On the wire a PUB/SUB message is [topic][frames...] (the topic frame is the SUB filter, e.g. a job
// id); ROUTER/DEALER messages are [frames...]. The frames are opaque here: every received message
// goes through ReceiveOptions::validator (in production an adapter around the wire's
// ParseEnvelope), which returns OK and the sender's (sender, epoch, seq), or a Status that rejects
// the message. Rejects are counted and logged (1st, 2nd, 4th, ... with the peer's address and
// CURVE key) and never reach the caller; duplicates are dropped; gaps and restarts are delivered
// with their SeqObservation so the caller can resynchronise; every valid message counts as
// "heard from" for liveness.
//
// Heartbeats: any accepted message counts as "heard from", but a 64 MiB delta on a slow link can
// take seconds, and a heartbeat queued behind it on the same socket waits that long. Give
// heartbeats their own PubChannel (its own connection, also in the link shaper) to the same SUB
// endpoint, with their own topic, and set ReceiveOptions::sequence_per_topic on the SUB.
//
// Threading: a channel is one socket; use it from one thread. stats() may be read from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/net/chunk_assembler.h"
#include "daemon/net/liveness.h"
#include "daemon/net/sequence.h"
#include "daemon/net/socket.h"
#include "daemon/util/status.h"

namespace diloco::net {

// What the validator learns about a message.
struct MessageMeta {
  std::string sender;      // the sending learner/site as the message states it
  uint64_t epoch = 0;      // the sender's incarnation
  uint64_t seq = 0;        // per (sender, epoch), +1 per message
  bool sequenced = true;   // false: not part of the sender's sequence (skip gap detection)
};

// OK and meta filled: accept. An error: reject (the message says why).
using Validator = std::function<Status(const Message& message, MessageMeta* meta)>;

struct ReceiveOptions {
  Validator validator;          // required
  bool track_sequence = true;   // detect gaps, duplicates and restarts per sender
  // SUB: number each topic separately, i.e. sequences per (topic, sender), for senders that use
  // one socket or counter per topic (e.g. heartbeats on their own socket and topic).
  bool sequence_per_topic = false;
  // When set: a liveness tracker fed by every accepted message (TakeLivenessChanges).
  std::optional<LivenessOptions> liveness;
  size_t max_frames = 1024;                       // more frames: rejected before validation
  uint64_t max_message_bytes = uint64_t{1} << 31;  // larger messages: rejected before validation
  // Wire messages in the chunked form (chunk_frame.h) are put back together under the two limits
  // above; at most this many at once, each dropped when its sender is silent for this long.
  size_t max_chunked_messages = 16;
  int64_t chunk_timeout_ms = 30000;
  uint64_t max_chunked_bytes = uint64_t{8} << 30;  // held by all of them together
  std::function<SteadyTime()> clock = [] { return std::chrono::steady_clock::now(); };
};

struct ChannelStats {
  uint64_t received = 0;        // accepted messages delivered (incl. gaps/restarts)
  uint64_t received_bytes = 0;  // their bytes, topic/routing frames included
  uint64_t rejected = 0;        // failed validation or limits (a dropped chunked message: once)
  uint64_t duplicates = 0;      // dropped as duplicates
  uint64_t gaps = 0;            // gap events
  uint64_t missed = 0;          // messages lost in gaps
  uint64_t restarts = 0;        // senders seen with a new epoch
  uint64_t sent = 0;
  uint64_t sent_bytes = 0;
  uint64_t send_failures = 0;   // would block (PUB: dropped at the HWM), unroutable, closed
};

struct Received {
  std::string topic;     // SubChannel: the topic frame
  std::string peer;      // RouterChannel: the sender's routing id (pass it to SendTo)
  std::string peer_key;  // the sender's CURVE public key (Z85) when the socket uses CURVE
  MessageMeta meta;
  SeqObservation seq;    // kFirst/kInOrder/kGap/kRestart (duplicates are never delivered)
  Message message;       // the frames after topic / routing id
};

// Shared receive path (validation, limits, sequence, liveness, stats).
class ChannelBase {
 public:
  virtual ~ChannelBase();
  Socket& socket() { return *socket_; }
  ChannelStats stats() const;
  // Liveness transitions since the last call: peers heard again (alive) and peers silent too long (dead).
  std::vector<PeerChange> TakeLivenessChanges(SteadyTime now);
  const LivenessTracker* liveness() const { return liveness_.get(); }
  const SequenceTracker& sequence() const { return sequence_; }

  Status Bind(const std::string& endpoint) { return socket_->Bind(endpoint); }
  Status Connect(const std::string& endpoint) { return socket_->Connect(endpoint); }
  std::string endpoint() const { return socket_->endpoint(); }

 protected:
  ChannelBase(std::unique_ptr<Socket> socket, ReceiveOptions options);
  // Receives until an acceptable message or the timeout; `envelope_frames` is how many leading
  // frames (topic, routing id) are transport framing.
  RecvResult ReceiveValid(Received* out, int timeout_ms, size_t envelope_frames);
  SendResult CountSend(SendResult r, size_t bytes);
  void Reject(const Message& m, const std::string& peer, const std::string& why);
  // Counts and logs a rejection; `what` describes the message, `from` its origin.
  void CountReject(const std::string& what, const std::string& from, const std::string& why);
  // A chunk message goes to the assembler; true (and *m the whole message) when it completed one.
  bool Assemble(const std::string& stream, const std::string& peer, Message* m);

  std::unique_ptr<Socket> socket_;
  ReceiveOptions options_;
  SequenceTracker sequence_;
  std::unique_ptr<LivenessTracker> liveness_;
  ChunkAssembler chunks_;
  std::vector<PeerChange> pending_changes_;
  struct AtomicStats {
    std::atomic<uint64_t> received{0}, received_bytes{0}, rejected{0}, duplicates{0}, gaps{0}, missed{0},
        restarts{0}, sent{0}, sent_bytes{0}, send_failures{0};
  } stats_;
};

class PubChannel : public ChannelBase {
 public:
  static Status Create(NetContext& context, const SocketOptions& options, std::unique_ptr<PubChannel>* out);
  // Sends [topic][frames...]; a wire message with chunk_info() (ToMessage) in the chunked form:
  // [topic][chunk frame k][chunk k] for each chunk, then [topic][seal][header] (chunk_frame.h).
  // Never blocks: at the HWM (slow subscriber) PUB drops the message (or what is left of it: the
  // receiver then drops the part it got) and this returns kWouldBlock (counted in send_failures).
  SendResult Publish(std::string_view topic, Message& message);
  // false: always one multipart message (for receivers older than the chunked form).
  void set_send_chunked(bool on) { send_chunked_ = on; }

 private:
  using ChannelBase::ChannelBase;
  SendResult PublishChunked(std::string_view topic, Message& message);
  bool send_chunked_ = true;
};

class SubChannel : public ChannelBase {
 public:
  static Status Create(NetContext& context, const SocketOptions& options, ReceiveOptions receive,
                       std::unique_ptr<SubChannel>* out);
  Status Subscribe(std::string_view topic_prefix) { return socket_->Subscribe(topic_prefix); }
  RecvResult Receive(Received* out, int timeout_ms) { return ReceiveValid(out, timeout_ms, 1); }

 private:
  using ChannelBase::ChannelBase;
};

class RouterChannel : public ChannelBase {
 public:
  static Status Create(NetContext& context, const SocketOptions& options, ReceiveOptions receive,
                       std::unique_ptr<RouterChannel>* out);
  RecvResult Receive(Received* out, int timeout_ms) { return ReceiveValid(out, timeout_ms, 1); }
  // Sends [peer][frames...] to the peer a message came from. kUnroutable when it is gone.
  SendResult SendTo(const std::string& peer, Message& message, int timeout_ms = 0);

 private:
  using ChannelBase::ChannelBase;
};

class DealerChannel : public ChannelBase {
 public:
  static Status Create(NetContext& context, const SocketOptions& options, ReceiveOptions receive,
                       std::unique_ptr<DealerChannel>* out);
  SendResult Send(Message& message, int timeout_ms = -1);
  RecvResult Receive(Received* out, int timeout_ms) { return ReceiveValid(out, timeout_ms, 0); }

 private:
  using ChannelBase::ChannelBase;
};

}  // namespace diloco::net
