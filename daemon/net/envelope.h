// The wire format of dilocod (DESIGN.md §4). One message = one ZeroMQ multipart message:
//   frame 0      the header: a FlatBuffer `Envelope` (proto/dilocod.fbs, file identifier "DLCD")
//                followed by 4 bytes, the little-endian CRC32C of the FlatBuffer bytes, so a
//                flipped bit in c_tokens or a version cannot skew a merge even on a plaintext link;
//   frames 1..n  the payload (Delta, Global and Snapshot only): the raw encoded tensor bytes cut
//                into chunks of exactly kChunkBytes (4 MiB), the last one shorter; the header
//                carries their total size, their count and their CRC32C.
// On a PUB, a message of two chunks or more travels in the chunked form instead (chunk_frame.h:
// each chunk its own ZeroMQ message with its own CRC32C, the header last), which the receiving
// channel puts back into these frames before ParseEnvelope sees them.
// BuildMessage writes a message from plain structs; ParseEnvelope is the one way to read one: it
// verifies everything (below) before it fills a ParsedMessage, whose structs are copies that own
// their data (nothing points into the frames; ParseEnvelopeInPlace: except the payload, which
// the ParsedMessage keeps alive through an owner of the frames).
//
// What ParseEnvelope checks, in this order, each failure a Status naming the sender (once known)
// and the field, e.g. "delta from learner-2: tensor 3 declares 1000 int8 values (block 64) = 1064
// bytes but 900":
//   1. frame count, header size (<= max_header_bytes), the header CRC32C, the file identifier;
//   2. the FlatBuffers Verifier (max depth 16, max tables ~ max_tensors + 2 max_list);
//   3. the body type (NONE or unknown: rejected; not in ParseOptions::accept: rejected),
//      protocol version, job id, sender (allowlist), string and list sizes;
//   4. semantics of the body (enums valid, floats finite, fragment < max_fragments, c_steps > 0,
//      ...) and, for payload messages: codec and block size, every tensor inside the model
//      [0, model_params), tensors in increasing order and disjoint, each tensor's encoded_bytes
//      == EncodedBytes(codec, numel, block) (top-k: within its bounds), their sum ==
//      payload_bytes <= max_payload_bytes, num_chunks == frames - 1 == ceil(payload / 4 MiB),
//      every chunk but the last exactly 4 MiB;
//   5. the payload's CRC32C: ParseEnvelope reassembles the chunks into one buffer, computing the
//      CRC as it copies; ParseEnvelopeInPlace computes it over the received chunks where they
//      lie (no copy; the last-received chunk first, while it is still in cache) and leaves the
//      payload in them.
// Messages without payload must have exactly one frame.
//
// A Snapshot (the whole global state for a joining learner, the ZeroMQ guide's Clone pattern)
// travels as one message per fragment; SnapshotAssembler checks that the parts belong together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "daemon/net/codec_kind.h"
#include "daemon/net/wire_constants.h"
#include "daemon/util/status.h"
#include "proto/dilocod_messages.h"

namespace diloco {

// The messages: one plain struct per table of proto/dilocod.fbs (HelloMsg, WelcomeMsg,
// HeartbeatMsg, DeltaMsg, GlobalMsg, SnapshotRequestMsg, SnapshotMsg, JobSpecMsg, ControlMsg,
// SyncerStatusMsg and the tables inside them: FragmentCounters, PayloadInfo, TensorDescriptor,
// Contributor, KeyValue, DroppedDelta, LearnerAck; EnvelopeHeader), its enums (PeerRole,
// ParamDType, JoinResult, LearnerState; CodecKind is codec_kind.h's), MessageType, MessageBody,
// TypeOf, MessageTypeName and PayloadOf. proto/gen_messages.py generates them into
// <build>/gen/proto/dilocod_messages.h, with the schema's comments: a field is written in the
// schema and nowhere else. What each message must satisfy is in message_checks.cpp.

// For ParseOptions::accept: MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat).
constexpr uint32_t MessageBit(MessageType type) { return uint32_t{1} << static_cast<int>(type); }
inline constexpr uint32_t kAnyMessage = ((uint32_t{1} << (kNumMessageTypes + 1)) - 1) & ~1u;


// ---- Build ----

// frame 0 and views of frames 1..n. The chunks point into the payload given to BuildMessage,
// which must stay alive and unchanged until the message is sent.
struct OutgoingMessage {
  std::vector<uint8_t> header;
  std::vector<std::span<const uint8_t>> chunks;
  // BuildMessage: each chunk's CRC32C (the payload's is their combination) and the header's
  // identity, so the transport may send every chunk as its own message (chunk_frame.h). Empty
  // from BuildMessageUnchecked: such messages travel as one multipart message.
  std::vector<uint32_t> chunk_crc32c;
  std::string sender;
  uint64_t incarnation = 0;
  uint64_t seq = 0;
  // BuildOptions::defer_payload_crc: `header` still lacks the payload's CRC32C (chunk_crc32c is
  // empty); SealPayloadCrc32c(header, crc_offset, crc) completes it. ToMessage does so, or leaves
  // it to the Message (ChunkInfo::crc_pending) when the chunks will be sent one by one.
  bool crc_pending = false;
  size_t crc_offset = 0;
  size_t num_frames() const { return 1 + chunks.size(); }
  // Header plus payload bytes (what bytes_up / bytes_down count).
  size_t wire_bytes() const;
};

// Writes header + body + payload as a message. Runs the same checks as ParseEnvelope (with
// limits from ParseOptions{} except model_params = kMaxModelParams) so a bad message fails here,
// at the sender, not at every receiver; computes payload_bytes, num_chunks and the CRCs.
// The payload must be empty for bodies without one.
struct BuildOptions {
  // Leave the payload CRC32C to the sender, which computes it chunk by chunk as it sends them
  // (PubChannel's chunked form) instead of in one pass before the first byte leaves. Ignored
  // for Snapshots (their fragment CRC is checked here) and messages without payload.
  bool defer_payload_crc = false;
};
Status BuildMessage(const EnvelopeHeader& header, const MessageBody& body,
                    std::span<const uint8_t> payload, OutgoingMessage* out, BuildOptions options = {});
// Writes crc as the payload CRC32C of a header built with defer_payload_crc (at crc_offset), then
// its trailer: the header is then the one BuildMessage writes without deferring.
void SealPayloadCrc32c(std::span<uint8_t> header, size_t crc_offset, uint32_t crc);

// ---- Parse ----

struct ParseOptions {
  // Accepted protocol versions.
  uint32_t min_protocol_version = kProtocolVersion;
  uint32_t max_protocol_version = kProtocolVersion;
  // The envelope's job id must equal job_id, unless any_job (e.g. a daemon receiving JobSpecs).
  std::string job_id;
  bool any_job = false;
  // When non-empty, only these senders are accepted.
  std::vector<std::string> allowed_senders;
  // Body types accepted on this socket (MessageBit(...) | ...).
  uint32_t accept = kAnyMessage;
  // Parameters in the model: every tensor must lie in [0, model_params). 0 rejects every
  // message with a payload. At most kMaxModelParams.
  uint64_t model_params = 0;
  // Fragment indices must be < max_fragments; per-fragment lists have at most this many.
  uint32_t max_fragments = 1024;
  // Frame 0 at most this big (FlatBuffer + CRC).
  size_t max_header_bytes = size_t{1} << 20;
  // Payload at most this big.
  uint64_t max_payload_bytes = uint64_t{1} << 32;
  // Tensors per payload.
  uint32_t max_tensors = 16384;
  // Other lists (contributors, learners, drops, control args).
  uint32_t max_list = 4096;
};

// The largest frame a receiver with these options accepts: what to give ZMQ_MAXMSGSIZE.
inline size_t MaxFrameBytes(const ParseOptions& o) {
  return o.max_header_bytes > kChunkBytes ? o.max_header_bytes : kChunkBytes;
}

// Reads no further than what it returns: header, typed body, contiguous payload.
struct ParsedMessage {
  // Default-initialising allocator: resizing the payload does not zero it first.
  template <class T>
  struct UninitAllocator : std::allocator<T> {
    template <class U>
    struct rebind { using other = UninitAllocator<U>; };
    UninitAllocator() = default;
    template <class U>
    UninitAllocator(const UninitAllocator<U>&) {}
    template <class U>
    void construct(U* p) { ::new (static_cast<void*>(p)) U; }
    template <class U, class... Args>
    void construct(U* p, Args&&... args) { ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...); }
  };
  using Bytes = std::vector<uint8_t, UninitAllocator<uint8_t>>;

  EnvelopeHeader header;
  MessageBody body;
  // ParseEnvelope: frames 1..n reassembled (empty without payload). ParseEnvelopeInPlace: empty
  // until MakeContiguous(); the payload is in payload_chunks.
  Bytes payload;
  uint32_t payload_crc32c = 0;  // as declared and verified
  size_t wire_bytes = 0;        // all frames' bytes

  // ParseEnvelopeInPlace only: the verified payload frames, in order, inside memory that
  // payload_owner keeps alive and unchanged (the received frames). Empty after ParseEnvelope.
  std::vector<std::span<const uint8_t>> payload_chunks;
  std::shared_ptr<const void> payload_owner;

  // The payload's bytes, whichever way it was parsed.
  uint64_t payload_size() const;
  // The payload as a list of spans: payload_chunks, or one span over payload (none if empty).
  std::vector<std::span<const uint8_t>> payload_spans() const;
  // Copies payload_chunks into payload (when the caller needs one buffer: tensor_bytes of a
  // tensor across chunks, a decoder over one span) and releases the frames. No-op when the
  // payload is already contiguous.
  void MakeContiguous();

  MessageType type() const { return TypeOf(body); }
  template <class T>
  const T* get() const { return std::get_if<T>(&body); }
  const PayloadInfo* payload_info() const { return PayloadOf(body); }
  // Tensor i's encoded bytes inside the payload (i < payload_info()->tensors.size()). In place:
  // empty when the tensor spans two chunks (call MakeContiguous() first to get every tensor).
  std::span<const uint8_t> tensor_bytes(size_t i) const;

  // Offsets of each tensor's bytes in payload (tensors + 1 entries); filled by ParseEnvelope.
  std::vector<uint64_t> tensor_payload_offsets;
};

// frames[0] = header, frames[1..] = payload chunks. On error *out is left in an unspecified
// (but valid, reusable) state; reuse one ParsedMessage per socket to keep its buffers.
Status ParseEnvelope(std::span<const std::span<const uint8_t>> frames, const ParseOptions& expect,
                     ParsedMessage* out);

// The same checks without copying the payload: the CRC32C is verified over the frames where
// they are, and out->payload_chunks point into them; frames_owner must keep the frames alive
// and unchanged, and is kept in out->payload_owner (for a message without payload it is
// dropped). For receivers that decode from chunks (DecodeTensors over payload_spans(), codec.h)
// instead of one buffer: this saves one pass over the payload (a copy and its cache misses).
// chunk_crc32c, when not empty: the CRC32C of each chunk, computed by the caller over the very
// bytes in frames 1..n as they arrived (chunk_assembler.h); they are combined, not recomputed.
Status ParseEnvelopeInPlace(std::span<const std::span<const uint8_t>> frames, const ParseOptions& expect,
                            std::shared_ptr<const void> frames_owner, ParsedMessage* out,
                            std::span<const uint32_t> chunk_crc32c = {});

// ParseEnvelopeInPlace's step 5: chunk count and sizes as ReassembleChunks, then the CRC32C over
// the chunks in place, last chunk first (CRCs combined), or the combination of chunk_crc32c
// (one per chunk, computed over these chunks) when given.
Status VerifyChunks(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                    uint32_t payload_crc32c, std::string_view what, std::span<const uint32_t> chunk_crc32c = {});

// The chunk reassembler ParseEnvelope uses: concatenates chunks into *out after checking that
// there are ceil(payload_bytes / kChunkBytes) of them, all kChunkBytes but a non-empty last one,
// summing to payload_bytes, and that their CRC32C is payload_crc32c. `what` prefixes errors.
Status ReassembleChunks(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                        uint32_t payload_crc32c, std::string_view what, ParsedMessage::Bytes* out);

// ---- For tests and fuzzers only ----

// BuildMessageUnchecked writes whatever it is given, without any check, so tests can make
// messages that are well-formed FlatBuffers but wrong; set fields replace computed ones.
struct RawOverrides {
  std::optional<uint64_t> payload_bytes;   // Payload.payload_bytes
  std::optional<uint32_t> payload_crc32c;  // Payload.payload_crc32c
  std::optional<uint32_t> num_chunks;      // Payload.num_chunks
  std::optional<uint8_t> body_type;        // Envelope.body_type (the union tag)
  size_t chunk_bytes = 0;                  // cut the payload at this size (0: kChunkBytes)
};
void BuildMessageUnchecked(const EnvelopeHeader& header, const MessageBody& body,
                           std::span<const uint8_t> payload, const RawOverrides& raw,
                           OutgoingMessage* out);
// Rewrites the CRC32C trailer of a frame 0 after its FlatBuffer bytes were changed.
void ResealHeader(std::vector<uint8_t>* frame0);

// ---- Snapshots across several messages ----

// Collects the parts of one snapshot answering one request. Every part must be a parsed
// Snapshot with the request's id; the first part fixes snapshot_id, num_parts and versions, and
// every later one must agree; parts and fragments may not repeat; the parts' tensor ranges must
// be disjoint; their payloads together at most max_total_bytes.
class SnapshotAssembler {
 public:
  SnapshotAssembler(uint64_t request_id, uint64_t max_total_bytes);

  // On error the assembler is unchanged (the bad part is dropped; the caller may re-request).
  Status Add(ParsedMessage&& part);
  bool complete() const { return num_parts_ > 0 && parts_received_ == num_parts_; }
  uint32_t parts_received() const { return parts_received_; }
  uint32_t num_parts() const { return num_parts_; }
  // The cut: every fragment's version at snapshot time (empty before the first part).
  const std::vector<uint64_t>& versions() const { return versions_; }
  // When complete(): the parts in part order; the assembler is empty afterwards.
  std::vector<ParsedMessage> Take();

 private:
  uint64_t request_id_;
  uint64_t max_total_bytes_;
  uint64_t total_bytes_ = 0;
  uint64_t snapshot_id_ = 0;
  uint32_t num_parts_ = 0;
  uint32_t parts_received_ = 0;
  std::vector<uint64_t> versions_;
  std::vector<ParsedMessage> parts_;           // indexed by part; empty body type = missing
  std::vector<bool> have_part_;
  std::vector<bool> have_fragment_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // [begin, end) of every tensor so far
};

}  // namespace diloco
