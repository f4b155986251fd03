// The wire format of dilocod (DESIGN.md §4). One message = one ZeroMQ multipart message:
//   frame 0      the header: a FlatBuffer `Envelope` (proto/dilocod.fbs, file identifier "DLCD")
//                followed by 4 bytes, the little-endian CRC32C of the FlatBuffer bytes, so a
//                flipped bit in c_tokens or a version cannot skew a merge even on a plaintext link;
//   frames 1..n  the payload (Delta, Global and Snapshot only): the raw encoded tensor bytes cut
//                into chunks of exactly kChunkBytes (4 MiB), the last one shorter; the header
//                carries their total size, their count and their CRC32C.
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
#include "daemon/util/status.h"

namespace diloco {

// Bumped when a release changes what the schema means (proto/dilocod.fbs changelog).
inline constexpr uint32_t kProtocolVersion = 1;
// Payload frames are cut at this size (the last one may be shorter).
inline constexpr size_t kChunkBytes = size_t{4} << 20;
// frame 0 = FlatBuffer bytes + this many bytes of CRC32C.
inline constexpr size_t kHeaderCrcBytes = 4;
// Hard ceiling for any model (2^48 parameters); ParseOptions::model_params is the real bound.
inline constexpr uint64_t kMaxModelParams = uint64_t{1} << 48;
// Length limits of identifier strings (printable ASCII, no spaces): job ids, sender and learner
// names, tensor names, control names and keys.
inline constexpr size_t kMaxJobIdBytes = 128;
inline constexpr size_t kMaxNameBytes = 256;
// Length limit of free text (refusal reasons, build strings, control values).
inline constexpr size_t kMaxTextBytes = 64 << 10;

// The body types, in the order of the schema's `Body` union (values = union type values).
enum class MessageType : uint8_t {
  kHello = 1,
  kWelcome = 2,
  kHeartbeat = 3,
  kDelta = 4,
  kGlobal = 5,
  kSnapshotRequest = 6,
  kSnapshot = 7,
  kJobSpec = 8,
  kControl = 9,
  kSyncerStatus = 10,
};
inline constexpr int kNumMessageTypes = 10;
// "hello", "welcome", "heartbeat", "delta", "global", "snapshot request", "snapshot",
// "job spec", "control", "syncer status".
std::string_view MessageTypeName(MessageType type);
// For ParseOptions::accept: MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat).
constexpr uint32_t MessageBit(MessageType type) { return uint32_t{1} << static_cast<int>(type); }
inline constexpr uint32_t kAnyMessage = ((uint32_t{1} << (kNumMessageTypes + 1)) - 1) & ~1u;

// ---- Plain C++ views of the schema's tables (proto/dilocod.fbs documents every field). ----

struct EnvelopeHeader {
  uint32_t protocol_version = kProtocolVersion;
  std::string job_id;         // identifier, 1..kMaxJobIdBytes
  std::string sender;         // identifier, 1..kMaxNameBytes: "learner-2", "syncer", a site name
  uint64_t seq = 0;           // per (sender, incarnation) and channel: +1 per message (gaps!)
  uint64_t incarnation = 0;   // random per process start: a restarted sender's seq starts over
  uint64_t sent_unix_ms = 0;  // sender's wall clock, for latency metrics only
  bool operator==(const EnvelopeHeader&) const = default;
};

enum class PeerRole : uint8_t { kLearner = 1, kSyncer = 2, kDaemon = 3, kClient = 4 };
enum class ParamDType : uint8_t { kFp32 = 1, kBf16 = 2 };
enum class JoinResult : uint8_t {
  kAccepted = 1,
  kTableMismatch = 2,    // tensor table digest or parameter count differs
  kDTypeMismatch = 3,
  kVersionMismatch = 4,  // protocol version
  kUnknownJob = 5,
  kNotAllowed = 6,       // sender not in the job's learner list
  kBusy = 7,             // try again later
  kLayoutMismatch = 8,   // fragment count or layout digest differs
};
enum class LearnerState : uint8_t {
  kJoining = 1,
  kTraining = 2,
  kResyncing = 3,  // waiting for a snapshot
  kStopping = 4,
  kFinished = 5,
  kFailed = 6,
};

// Learner (or daemon) -> syncer: asks to join a job. The syncer answers with a Welcome.
struct HelloMsg {
  PeerRole role = PeerRole::kLearner;
  uint64_t tensor_table_digest = 0;     // TensorTable::digest()
  uint64_t num_params = 0;              // <= kMaxModelParams
  ParamDType param_dtype = ParamDType::kFp32;
  uint32_t num_fragments = 0;
  uint64_t fragment_layout_digest = 0;  // digest of the fragment -> tensor ranges assignment
  std::string build;                    // software version, free text, for logs
  bool operator==(const HelloMsg&) const = default;
};

// Syncer -> learner: accepted, or refused with a reason (required then).
struct WelcomeMsg {
  JoinResult result = JoinResult::kAccepted;
  std::string reason;                   // free text; non-empty unless accepted
  std::string learner;                  // identifier: whom this answers
  uint64_t tensor_table_digest = 0;     // the syncer's, so a refused learner can say what differs
  uint64_t num_params = 0;
  ParamDType param_dtype = ParamDType::kFp32;
  uint32_t num_fragments = 0;
  uint64_t fragment_layout_digest = 0;
  std::vector<uint64_t> versions;       // current global version per fragment (<= max_fragments)
  uint32_t heartbeat_interval_ms = 0;   // what the syncer expects from learners
  uint32_t heartbeat_timeout_ms = 0;
  bool operator==(const WelcomeMsg&) const = default;
};

// Per-fragment state of a learner, in heartbeats.
struct FragmentCounters {
  uint32_t fragment = 0;
  uint64_t base_version = 0;  // version of the global fragment it last folded
  uint64_t c_steps = 0;       // inner steps since then
  uint64_t c_tokens = 0;      // tokens since then
  bool in_flight = false;     // a delta for this fragment awaits its global
  bool operator==(const FragmentCounters&) const = default;
};

// Learner -> syncer, on a timer (liveness, metrics, the grace window's step-time EMA).
struct HeartbeatMsg {
  LearnerState state = LearnerState::kTraining;
  uint64_t step = 0;          // inner steps done
  uint64_t tokens = 0;        // tokens trained on
  float loss = std::numeric_limits<float>::quiet_NaN();  // last train loss; NaN: none yet
  float tokens_per_s = 0;     // finite, >= 0
  float step_time_ms = 0;     // EMA of one inner step; finite, >= 0
  uint32_t interval_ms = 0;   // the sender's heartbeat period
  std::vector<FragmentCounters> fragments;  // <= max_fragments, fragment indices distinct
  bool operator==(const HeartbeatMsg& o) const;  // NaN loss equals NaN loss
};

// One tensor (or any range of the flat parameter buffer) in a payload.
struct TensorDescriptor {
  std::string name;            // identifier or empty, for logs and per-tensor merge rules
  uint64_t offset = 0;         // first element in the flat parameter buffer
  uint64_t numel = 0;          // > 0
  uint64_t encoded_bytes = 0;  // this tensor's bytes in the payload
  bool operator==(const TensorDescriptor&) const = default;
};

// How a payload is encoded and what it holds: the tensors' encodings back to back, in order,
// offsets increasing and ranges disjoint. Dense: encoded_bytes == EncodedBytes(codec, numel,
// block_size). Top-k (codec.h): 16 + EncodedBytes(codec, 1, block) <= encoded_bytes <=
// 16 + ceil(numel / 8) + EncodedBytes(codec, numel, block), exact size checked by Decode.
// Each tensor's bytes start at ParsedMessage::tensor_bytes(i); they are not aligned (memcpy).
struct PayloadInfo {
  CodecKind codec = CodecKind::kFp32;
  int block_size = kDefaultCodecBlock;  // even, in [2, 65536] for every codec (as CodecOptions)
  double topk_fraction = 0;             // 0: dense; in (0, 1): top-k
  std::vector<TensorDescriptor> tensors;  // 1..max_tensors
  bool operator==(const PayloadInfo&) const = default;
};

// Learner -> syncer: an outer delta Δ = base − θ of one fragment, encoded.
struct DeltaMsg {
  uint32_t fragment = 0;
  uint64_t base_version = 0;  // version of the global fragment the learner started from
  uint64_t c_steps = 0;       // inner steps behind this delta; > 0
  uint64_t c_tokens = 0;      // tokens behind this delta
  uint64_t learner_step = 0;  // the learner's inner step when it sent this
  PayloadInfo payload;
  bool operator==(const DeltaMsg&) const = default;
};

// A learner's part in a merge (Global::contributors, for the learner's in-flight bookkeeping).
struct Contributor {
  std::string learner;        // identifier
  uint64_t base_version = 0;  // the base of its delta (staleness = version - 1 - base_version)
  uint64_t c_steps = 0;
  uint64_t c_tokens = 0;
  float weight = 0;           // normalised merge weight; finite, >= 0
  bool operator==(const Contributor&) const = default;
};

// Syncer -> learners: a new version of one fragment, either the full fragment (is_full) or the
// update Θ_new − Θ_old on top of base_version == version − 1.
struct GlobalMsg {
  uint32_t fragment = 0;
  uint64_t version = 0;          // >= 1
  uint64_t base_version = 0;     // update: version − 1; full: 0
  bool is_full = false;
  uint32_t fragment_crc32c = 0;  // CRC32C of the fragment's fp32 values after applying, in
                                 // descriptor order: the learner verifies it, else resyncs
  std::vector<Contributor> contributors;  // <= max_list
  PayloadInfo payload;
  bool operator==(const GlobalMsg&) const = default;
};

// Learner -> syncer (DEALER -> ROUTER): send me the global state.
struct SnapshotRequestMsg {
  uint64_t request_id = 0;          // echoed in every Snapshot part
  std::vector<uint32_t> fragments;  // empty: all; else distinct, < max_fragments
  std::string reason;               // free text: "join", "gap in global stream", "crc mismatch"
  bool operator==(const SnapshotRequestMsg&) const = default;
};

// Syncer -> learner: one part of a snapshot = one fragment's full fp32 values (codec fp32, dense).
struct SnapshotMsg {
  uint64_t request_id = 0;
  uint64_t snapshot_id = 0;        // same in every part of one snapshot
  uint32_t part = 0;               // < num_parts
  uint32_t num_parts = 0;          // 1..max_fragments
  uint32_t fragment = 0;           // < versions.size()
  uint64_t version = 0;            // == versions[fragment]
  uint32_t fragment_crc32c = 0;    // CRC32C of the payload's fp32 values (== payload CRC)
  std::vector<uint64_t> versions;  // every fragment's version at snapshot time: the cut after
                                   // which Globals apply (Clone pattern); 1..max_fragments
  PayloadInfo payload;
  bool operator==(const SnapshotMsg&) const = default;
};

// Control plane: a job's resolved run config (job id in the envelope).
struct JobSpecMsg {
  std::string config_yaml;  // non-empty
  bool operator==(const JobSpecMsg&) const = default;
};

struct KeyValue {
  std::string key;    // identifier
  std::string value;  // free text
  bool operator==(const KeyValue&) const = default;
};

// Room for control messages (stop, chaos, status queries...) without a schema change.
struct ControlMsg {
  std::string name;        // identifier
  uint64_t request_id = 0;
  std::vector<KeyValue> args;  // <= max_list
  bool operator==(const ControlMsg&) const = default;
};

struct DroppedDelta {
  std::string learner;        // identifier
  uint32_t fragment = 0;
  uint64_t base_version = 0;
  std::string reason;         // free text: "stale: base 3, current 9", "norm 40x median", "nan"
  bool operator==(const DroppedDelta&) const = default;
};

// What the syncer heard of one learner incarnation's delta stream and which of its deltas it
// holds pending: a learner whose in-flight delta is at or below heard_seq and not pending knows
// the syncer will never merge it (lost on the way, dropped, or the syncer restarted).
struct LearnerAck {
  std::string learner;        // identifier
  uint64_t incarnation = 0;
  uint64_t heard_seq = 0;     // highest seq heard on the learner's main uplink stream
  std::vector<uint32_t> pending_fragments;  // <= max_fragments, each < max_fragments
  std::vector<uint64_t> pending_bases;      // same length: the base version of each
  bool operator==(const LearnerAck&) const = default;
};

// Syncer -> learners, on a timer and on change.
struct SyncerStatusMsg {
  std::vector<uint64_t> versions;           // per fragment, <= max_fragments
  std::vector<std::string> live_learners;   // identifiers, <= max_list
  uint64_t merges = 0;
  uint64_t dropped_deltas = 0;              // total so far
  std::vector<DroppedDelta> recent_drops;   // since the previous status, <= max_list
  std::vector<LearnerAck> acks;             // <= max_list
  std::vector<uint64_t> live_steps;         // empty, or live_learners[i]'s latest heartbeat step
  bool operator==(const SyncerStatusMsg&) const = default;
};

// Alternatives in MessageType order (index + 1 == MessageType value).
using MessageBody = std::variant<HelloMsg, WelcomeMsg, HeartbeatMsg, DeltaMsg, GlobalMsg,
                                 SnapshotRequestMsg, SnapshotMsg, JobSpecMsg, ControlMsg,
                                 SyncerStatusMsg>;
MessageType TypeOf(const MessageBody& body);
// The PayloadInfo of a Delta, Global or Snapshot; nullptr for other bodies.
const PayloadInfo* PayloadOf(const MessageBody& body);

// ---- Build ----

// frame 0 and views of frames 1..n. The chunks point into the payload given to BuildMessage,
// which must stay alive and unchanged until the message is sent.
struct OutgoingMessage {
  std::vector<uint8_t> header;
  std::vector<std::span<const uint8_t>> chunks;
  size_t num_frames() const { return 1 + chunks.size(); }
  // Header plus payload bytes (what bytes_up / bytes_down count).
  size_t wire_bytes() const;
};

// Writes header + body + payload as a message. Runs the same checks as ParseEnvelope (with
// limits from ParseOptions{} except model_params = kMaxModelParams) so a bad message fails here,
// at the sender, not at every receiver; computes payload_bytes, num_chunks and the CRCs.
// The payload must be empty for bodies without one.
Status BuildMessage(const EnvelopeHeader& header, const MessageBody& body,
                    std::span<const uint8_t> payload, OutgoingMessage* out);

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
Status ParseEnvelopeInPlace(std::span<const std::span<const uint8_t>> frames, const ParseOptions& expect,
                            std::shared_ptr<const void> frames_owner, ParsedMessage* out);

// ParseEnvelopeInPlace's step 5: chunk count and sizes as ReassembleChunks, then the CRC32C over
// the chunks in place, last chunk first (CRCs combined).
Status VerifyChunks(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                    uint32_t payload_crc32c, std::string_view what);

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
