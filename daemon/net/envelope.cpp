// Wire format: BuildMessage / ParseEnvelope / ReassembleChunks / SnapshotAssembler.
// See envelope.h for the framing and the order of checks.
#include "daemon/net/envelope.h"

#include <flatbuffers/flatbuffers.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "daemon/util/crc32c.h"
#include "proto/dilocod_generated.h"

namespace diloco {
namespace {

namespace fb = flatbuffers;
namespace w = diloco::wire;

// codec.h's top-k payload header size (kTopkHeaderBytes there): the wire only bounds top-k
// tensor sizes, the codec checks them exactly.
constexpr uint64_t kTopkHeaderBytes = 16;
constexpr int kMinBlock = 2;
constexpr int kMaxBlock = 65536;
// FlatBuffer minimum: root offset + file identifier.
constexpr size_t kMinFlatBufferBytes = 8;

static_assert(static_cast<int>(w::Body::MAX) == kNumMessageTypes);
static_assert(static_cast<int>(w::Body::Delta) == static_cast<int>(MessageType::kDelta));
static_assert(static_cast<int>(w::Body::SyncerStatus) == static_cast<int>(MessageType::kSyncerStatus));
static_assert(static_cast<int>(w::Codec::Int4) == static_cast<int>(CodecKind::kInt4));
static_assert(static_cast<int>(w::Codec::Int8) == static_cast<int>(CodecKind::kInt8));
static_assert(static_cast<int>(w::Codec::Bf16) == static_cast<int>(CodecKind::kBf16));
static_assert(static_cast<int>(w::Codec::Fp32) == static_cast<int>(CodecKind::kFp32));
static_assert(static_cast<int>(w::Codec::TopkChunked) == static_cast<int>(CodecKind::kTopkChunked));
static_assert(static_cast<int>(w::JoinResult::MAX) == static_cast<int>(JoinResult::kLayoutMismatch));
static_assert(static_cast<int>(w::LearnerState::MAX) == static_cast<int>(LearnerState::kFailed));
static_assert(static_cast<int>(w::Role::MAX) == static_cast<int>(PeerRole::kClient));
static_assert(static_cast<int>(w::DType::MAX) == static_cast<int>(ParamDType::kBf16));
static_assert(std::variant_size_v<MessageBody> == kNumMessageTypes);

// ---------------------------------------------------------------------------------------------
// Small helpers

std::string Str(uint64_t v) { return std::to_string(v); }

// Identifiers: printable ASCII without spaces (they end up in logs and file names).
bool IsIdentifier(std::string_view s) {
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

// A sender name fit for an error message even when it is not a valid identifier.
std::string Printable(std::string_view s, size_t max = 64) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const char c = s[i];
    out += (c >= 0x20 && c <= 0x7e) ? c : '?';
  }
  if (s.size() > max) out += "...";
  return out;
}

Status CheckIdentifier(std::string_view s, size_t max_bytes, bool may_be_empty,
                       std::string_view who, std::string_view field) {
  if (s.empty() && !may_be_empty) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " is empty");
  }
  if (s.size() > max_bytes) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " has " + Str(s.size()) +
                         " bytes, more than " + Str(max_bytes));
  }
  if (!IsIdentifier(s)) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " \"" + Printable(s) +
                         "\" is not printable ASCII without spaces");
  }
  return Status::Ok();
}

Status CheckText(std::string_view s, size_t max_bytes, std::string_view who,
                 std::string_view field) {
  if (s.size() > max_bytes) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " has " + Str(s.size()) +
                         " bytes, more than " + Str(max_bytes));
  }
  return Status::Ok();
}

Status CheckListSize(size_t n, size_t max, std::string_view who, std::string_view field) {
  if (n > max) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " has " + Str(n) +
                         " entries, more than " + Str(max));
  }
  return Status::Ok();
}

Status CheckFragment(uint64_t fragment, const ParseOptions& o, std::string_view who,
                     std::string_view field = "fragment") {
  if (fragment >= o.max_fragments) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " " + Str(fragment) +
                         " is out of range (max_fragments " + Str(o.max_fragments) + ")");
  }
  return Status::Ok();
}

// Fragment indices in a list: each < max_fragments, no repeats.
Status CheckFragmentSet(std::vector<uint32_t> fragments, const ParseOptions& o,
                        std::string_view who, std::string_view field) {
  DL_RETURN_IF_ERROR(CheckListSize(fragments.size(), o.max_fragments, who, field));
  for (uint32_t f : fragments) DL_RETURN_IF_ERROR(CheckFragment(f, o, who, field));
  std::sort(fragments.begin(), fragments.end());
  auto dup = std::adjacent_find(fragments.begin(), fragments.end());
  if (dup != fragments.end()) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " lists fragment " +
                         Str(*dup) + " twice");
  }
  return Status::Ok();
}

Status CheckFiniteNonNegative(float v, std::string_view who, std::string_view field) {
  if (!std::isfinite(v) || v < 0) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " is " +
                         std::to_string(v) + ", not a finite value >= 0");
  }
  return Status::Ok();
}

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

template <class E>
bool InRange(E e, E lo, E hi) {
  using U = std::underlying_type_t<E>;
  return static_cast<U>(e) >= static_cast<U>(lo) && static_cast<U>(e) <= static_cast<U>(hi);
}

std::string MessageWho(MessageType type, std::string_view sender) {
  return std::string(MessageTypeName(type)) + " from " + Printable(sender);
}

// ---------------------------------------------------------------------------------------------
// Semantic checks on the plain structs (shared by BuildMessage and ParseEnvelope).

Status CheckHeader(const EnvelopeHeader& h, const ParseOptions& o, std::string_view who) {
  DL_RETURN_IF_ERROR(CheckIdentifier(h.sender, kMaxNameBytes, false, who, "sender"));
  DL_RETURN_IF_ERROR(CheckIdentifier(h.job_id, kMaxJobIdBytes, false, who, "job id"));
  if (h.protocol_version < o.min_protocol_version || h.protocol_version > o.max_protocol_version) {
    return Status::Error(std::string(who) + ": protocol version " + Str(h.protocol_version) +
                         " is not supported (this build speaks " + Str(o.min_protocol_version) +
                         ".." + Str(o.max_protocol_version) + "); upgrade the older side");
  }
  if (!o.any_job && h.job_id != o.job_id) {
    return Status::Error(std::string(who) + ": job id \"" + h.job_id + "\" is not this job (\"" +
                         Printable(o.job_id) + "\")");
  }
  if (!o.allowed_senders.empty() &&
      std::find(o.allowed_senders.begin(), o.allowed_senders.end(), h.sender) ==
          o.allowed_senders.end()) {
    return Status::Error(std::string(who) + ": sender is not in the allowlist of " +
                         Str(o.allowed_senders.size()) + " peers");
  }
  return Status::Ok();
}

// Checks a payload description; *payload_bytes = the sum of the tensors' encoded bytes.
Status CheckPayloadInfo(const PayloadInfo& p, const ParseOptions& o, std::string_view who,
                        uint64_t* payload_bytes) {
  if (!IsValidCodecKind(static_cast<uint8_t>(p.codec))) {
    return Status::Error(std::string(who) + ": codec " + Str(static_cast<uint8_t>(p.codec)) +
                         " is unknown (valid: 1 fp32, 2 bf16, 3 int8, 4 int4, 5 topk_chunked)");
  }
  if (p.block_size < kMinBlock || p.block_size > kMaxBlock || p.block_size % 2 != 0) {
    return Status::Error(std::string(who) + ": block size " + std::to_string(p.block_size) +
                         " is not an even number in [2, 65536]");
  }
  const bool chunked = p.codec == CodecKind::kTopkChunked;
  const bool topk = p.topk_fraction != 0;
  if (chunked && topk) {
    return Status::Error(std::string(who) + ": topk_chunked with a top-k fraction of " +
                         std::to_string(p.topk_fraction) + " (must be 0)");
  }
  if (topk && !(p.topk_fraction > 0 && p.topk_fraction < 1)) {
    return Status::Error(std::string(who) + ": top-k fraction " + std::to_string(p.topk_fraction) +
                         " is not 0 (dense) or in (0, 1)");
  }
  if (o.model_params == 0) {
    return Status::Error(std::string(who) +
                         ": carries a payload but no model is configured (ParseOptions::"
                         "model_params = 0)");
  }
  const uint64_t model = std::min(o.model_params, kMaxModelParams);
  if (p.tensors.empty()) return Status::Error(std::string(who) + ": payload lists no tensors");
  DL_RETURN_IF_ERROR(CheckListSize(p.tensors.size(), o.max_tensors, who, "tensor list"));
  const std::string codec(CodecName(p.codec));
  uint64_t end_prev = 0;
  uint64_t sum = 0;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const TensorDescriptor& t = p.tensors[i];
    const std::string tw = std::string(who) + ": tensor " + Str(i) +
                           (t.name.empty() ? std::string() : " (" + Printable(t.name) + ")");
    DL_RETURN_IF_ERROR(CheckIdentifier(t.name, kMaxNameBytes, true, who, "tensor " + Str(i) + " name"));
    if (t.numel == 0) return Status::Error(tw + " has no elements");
    if (t.numel > model || t.offset > model - t.numel) {
      return Status::Error(tw + " covers elements [" + Str(t.offset) + ", " + Str(t.offset) +
                           " + " + Str(t.numel) + ") outside the model's " + Str(model) +
                           " parameters");
    }
    if (i > 0 && t.offset < end_prev) {
      return Status::Error(tw + " starts at element " + Str(t.offset) +
                           ", before the end of tensor " + Str(i - 1) + " (" + Str(end_prev) +
                           "): tensors must be in increasing order and disjoint");
    }
    end_prev = t.offset + t.numel;
    const uint64_t dense = EncodedBytes(p.codec, t.numel, p.block_size);
    if (chunked) {
      // keep and bits are in the tensor's header: bounded here by keep 1 at 2 bits and keep = the
      // chunk at 8 bits; Decode checks the exact size.
      const uint64_t lo = TopkChunkedBytes(t.numel, p.block_size, 1, 2);
      const uint64_t hi = TopkChunkedBytes(t.numel, p.block_size, p.block_size, 8);
      if (t.encoded_bytes < lo || t.encoded_bytes > hi) {
        return Status::Error(tw + " declares " + Str(t.encoded_bytes) + " bytes for topk_chunked of " +
                             Str(t.numel) + " values (chunk " + std::to_string(p.block_size) + "); valid: " +
                             Str(lo) + ".." + Str(hi));
      }
    } else if (!topk) {
      if (t.encoded_bytes != dense) {
        return Status::Error(tw + " declares " + Str(t.numel) + " " + codec + " values" +
                             (CodecUsesBlocks(p.codec) ? " (block " + std::to_string(p.block_size) + ")" : std::string()) +
                             " = " + Str(dense) + " bytes but " + Str(t.encoded_bytes));
      }
    } else {
      const uint64_t lo = kTopkHeaderBytes + EncodedBytes(p.codec, 1, p.block_size);
      const uint64_t hi = kTopkHeaderBytes + CeilDiv(t.numel, 8) + dense;
      if (t.encoded_bytes < lo || t.encoded_bytes > hi) {
        return Status::Error(tw + " declares " + Str(t.encoded_bytes) + " bytes for top-k of " +
                             Str(t.numel) + " " + codec + " values; valid: " + Str(lo) + ".." +
                             Str(hi));
      }
    }
    sum += t.encoded_bytes;  // <= 16384 tensors x < 2^51 bytes: no overflow
    if (sum > o.max_payload_bytes) {
      return Status::Error(std::string(who) + ": payload of more than " + Str(sum) +
                           " bytes exceeds the limit of " + Str(o.max_payload_bytes));
    }
  }
  *payload_bytes = sum;
  return Status::Ok();
}

// Semantics of the body; *payload_bytes = bytes the payload must have (0 without one).
Status CheckBody(const MessageBody& body, const ParseOptions& o, std::string_view who,
                 uint64_t* payload_bytes) {
  *payload_bytes = 0;
  switch (TypeOf(body)) {
    case MessageType::kHello: {
      const auto& m = std::get<HelloMsg>(body);
      if (!InRange(m.role, PeerRole::kLearner, PeerRole::kClient)) {
        return Status::Error(std::string(who) + ": role " + Str(static_cast<uint8_t>(m.role)) + " is invalid");
      }
      if (!InRange(m.param_dtype, ParamDType::kFp32, ParamDType::kBf16)) {
        return Status::Error(std::string(who) + ": parameter dtype " +
                             Str(static_cast<uint8_t>(m.param_dtype)) + " is invalid");
      }
      if (m.num_params > kMaxModelParams) {
        return Status::Error(std::string(who) + ": " + Str(m.num_params) + " parameters is more than the limit " + Str(kMaxModelParams));
      }
      if (m.num_fragments > o.max_fragments) {
        return Status::Error(std::string(who) + ": " + Str(m.num_fragments) + " fragments is more than max_fragments " + Str(o.max_fragments));
      }
      return CheckText(m.build, kMaxTextBytes, who, "build");
    }
    case MessageType::kWelcome: {
      const auto& m = std::get<WelcomeMsg>(body);
      if (!InRange(m.result, JoinResult::kAccepted, JoinResult::kLayoutMismatch)) {
        return Status::Error(std::string(who) + ": join result " + Str(static_cast<uint8_t>(m.result)) + " is invalid");
      }
      if (m.result != JoinResult::kAccepted && m.reason.empty()) {
        return Status::Error(std::string(who) + ": refusal without a reason");
      }
      DL_RETURN_IF_ERROR(CheckText(m.reason, kMaxTextBytes, who, "reason"));
      DL_RETURN_IF_ERROR(CheckIdentifier(m.learner, kMaxNameBytes, false, who, "learner"));
      if (!InRange(m.param_dtype, ParamDType::kFp32, ParamDType::kBf16)) {
        return Status::Error(std::string(who) + ": parameter dtype " + Str(static_cast<uint8_t>(m.param_dtype)) + " is invalid");
      }
      if (m.num_params > kMaxModelParams) {
        return Status::Error(std::string(who) + ": " + Str(m.num_params) + " parameters is more than the limit " + Str(kMaxModelParams));
      }
      if (m.num_fragments > o.max_fragments) {
        return Status::Error(std::string(who) + ": " + Str(m.num_fragments) + " fragments is more than max_fragments " + Str(o.max_fragments));
      }
      DL_RETURN_IF_ERROR(CheckListSize(m.versions.size(), o.max_fragments, who, "versions"));
      if (m.result == JoinResult::kAccepted && m.versions.size() != m.num_fragments) {
        return Status::Error(std::string(who) + ": " + Str(m.versions.size()) + " versions for " + Str(m.num_fragments) + " fragments");
      }
      return Status::Ok();
    }
    case MessageType::kHeartbeat: {
      const auto& m = std::get<HeartbeatMsg>(body);
      if (!InRange(m.state, LearnerState::kJoining, LearnerState::kFailed)) {
        return Status::Error(std::string(who) + ": learner state " + Str(static_cast<uint8_t>(m.state)) + " is invalid");
      }
      if (std::isinf(m.loss)) return Status::Error(std::string(who) + ": loss is infinite");
      DL_RETURN_IF_ERROR(CheckFiniteNonNegative(m.tokens_per_s, who, "tokens_per_s"));
      DL_RETURN_IF_ERROR(CheckFiniteNonNegative(m.step_time_ms, who, "step_time_ms"));
      std::vector<uint32_t> fragments;
      fragments.reserve(m.fragments.size());
      for (const FragmentCounters& c : m.fragments) fragments.push_back(c.fragment);
      return CheckFragmentSet(std::move(fragments), o, who, "fragment counters");
    }
    case MessageType::kDelta: {
      const auto& m = std::get<DeltaMsg>(body);
      DL_RETURN_IF_ERROR(CheckFragment(m.fragment, o, who));
      if (m.c_steps == 0) return Status::Error(std::string(who) + ": c_steps is 0 (a delta comes from at least one inner step)");
      return CheckPayloadInfo(m.payload, o, who, payload_bytes);
    }
    case MessageType::kGlobal: {
      const auto& m = std::get<GlobalMsg>(body);
      DL_RETURN_IF_ERROR(CheckFragment(m.fragment, o, who));
      if (m.version == 0) return Status::Error(std::string(who) + ": version 0 (versions start at 1)");
      if (m.is_full && m.base_version != 0) {
        return Status::Error(std::string(who) + ": a full fragment with base version " + Str(m.base_version) + " (must be 0)");
      }
      if (!m.is_full && m.base_version != m.version - 1) {
        return Status::Error(std::string(who) + ": an update to version " + Str(m.version) + " on top of version " + Str(m.base_version) + " (must be " + Str(m.version - 1) + ")");
      }
      DL_RETURN_IF_ERROR(CheckListSize(m.contributors.size(), o.max_list, who, "contributors"));
      for (size_t i = 0; i < m.contributors.size(); ++i) {
        const Contributor& c = m.contributors[i];
        DL_RETURN_IF_ERROR(CheckIdentifier(c.learner, kMaxNameBytes, false, who, "contributor " + Str(i) + " learner"));
        DL_RETURN_IF_ERROR(CheckFiniteNonNegative(c.weight, who, "contributor " + Str(i) + " weight"));
      }
      return CheckPayloadInfo(m.payload, o, who, payload_bytes);
    }
    case MessageType::kSnapshotRequest: {
      const auto& m = std::get<SnapshotRequestMsg>(body);
      DL_RETURN_IF_ERROR(CheckText(m.reason, kMaxTextBytes, who, "reason"));
      return CheckFragmentSet(m.fragments, o, who, "fragments");
    }
    case MessageType::kSnapshot: {
      const auto& m = std::get<SnapshotMsg>(body);
      if (m.num_parts == 0 || m.num_parts > o.max_fragments) {
        return Status::Error(std::string(who) + ": " + Str(m.num_parts) + " parts (valid: 1.." + Str(o.max_fragments) + ")");
      }
      if (m.part >= m.num_parts) {
        return Status::Error(std::string(who) + ": part " + Str(m.part) + " of " + Str(m.num_parts));
      }
      if (m.versions.empty()) return Status::Error(std::string(who) + ": no fragment versions");
      DL_RETURN_IF_ERROR(CheckListSize(m.versions.size(), o.max_fragments, who, "versions"));
      if (m.fragment >= m.versions.size()) {
        return Status::Error(std::string(who) + ": fragment " + Str(m.fragment) + " but versions for " + Str(m.versions.size()) + " fragments");
      }
      if (m.version != m.versions[m.fragment]) {
        return Status::Error(std::string(who) + ": fragment " + Str(m.fragment) + " at version " + Str(m.version) + " but the cut says " + Str(m.versions[m.fragment]));
      }
      if (m.payload.codec != CodecKind::kFp32 || m.payload.topk_fraction != 0) {
        return Status::Error(std::string(who) + ": snapshot payload must be dense fp32, is " +
                             std::string(CodecName(m.payload.codec)) +
                             (m.payload.topk_fraction != 0 ? " top-k" : ""));
      }
      return CheckPayloadInfo(m.payload, o, who, payload_bytes);
    }
    case MessageType::kJobSpec: {
      const auto& m = std::get<JobSpecMsg>(body);
      if (m.config_yaml.empty()) return Status::Error(std::string(who) + ": empty config");
      return Status::Ok();
    }
    case MessageType::kControl: {
      const auto& m = std::get<ControlMsg>(body);
      DL_RETURN_IF_ERROR(CheckIdentifier(m.name, kMaxNameBytes, false, who, "name"));
      DL_RETURN_IF_ERROR(CheckListSize(m.args.size(), o.max_list, who, "args"));
      for (size_t i = 0; i < m.args.size(); ++i) {
        DL_RETURN_IF_ERROR(CheckIdentifier(m.args[i].key, kMaxNameBytes, false, who, "arg " + Str(i) + " key"));
        DL_RETURN_IF_ERROR(CheckText(m.args[i].value, kMaxTextBytes, who, "arg " + Str(i) + " value"));
      }
      return Status::Ok();
    }
    case MessageType::kSyncerStatus: {
      const auto& m = std::get<SyncerStatusMsg>(body);
      DL_RETURN_IF_ERROR(CheckListSize(m.versions.size(), o.max_fragments, who, "versions"));
      DL_RETURN_IF_ERROR(CheckListSize(m.live_learners.size(), o.max_list, who, "live learners"));
      for (size_t i = 0; i < m.live_learners.size(); ++i) {
        DL_RETURN_IF_ERROR(CheckIdentifier(m.live_learners[i], kMaxNameBytes, false, who, "live learner " + Str(i)));
      }
      if (!m.live_steps.empty() && m.live_steps.size() != m.live_learners.size())
        return Status::Error(std::string(who) + ": " + Str(m.live_steps.size()) + " live steps for " +
                             Str(m.live_learners.size()) + " live learners");
      DL_RETURN_IF_ERROR(CheckListSize(m.recent_drops.size(), o.max_list, who, "recent drops"));
      for (size_t i = 0; i < m.recent_drops.size(); ++i) {
        const DroppedDelta& d = m.recent_drops[i];
        DL_RETURN_IF_ERROR(CheckIdentifier(d.learner, kMaxNameBytes, false, who, "drop " + Str(i) + " learner"));
        DL_RETURN_IF_ERROR(CheckFragment(d.fragment, o, who, "drop " + Str(i) + " fragment"));
        DL_RETURN_IF_ERROR(CheckText(d.reason, kMaxTextBytes, who, "drop " + Str(i) + " reason"));
      }
      DL_RETURN_IF_ERROR(CheckListSize(m.acks.size(), o.max_list, who, "acks"));
      for (size_t i = 0; i < m.acks.size(); ++i) {
        const LearnerAck& a = m.acks[i];
        const std::string what = "ack " + Str(i);
        DL_RETURN_IF_ERROR(CheckIdentifier(a.learner, kMaxNameBytes, false, who, what + " learner"));
        DL_RETURN_IF_ERROR(CheckListSize(a.pending_fragments.size(), o.max_fragments, who, what + " pending"));
        if (a.pending_bases.size() != a.pending_fragments.size())
          return Status::Error(std::string(who) + ": " + what + " has " + Str(a.pending_fragments.size()) +
                               " pending fragments but " + Str(a.pending_bases.size()) + " bases");
        for (size_t j = 0; j < a.pending_fragments.size(); ++j)
          DL_RETURN_IF_ERROR(CheckFragment(a.pending_fragments[j], o, who, what + " pending " + Str(j)));
      }
      return Status::Ok();
    }
  }
  return Status::Error(std::string(who) + ": unknown body");
}

// ---------------------------------------------------------------------------------------------
// Build: plain structs -> FlatBuffer.

struct PayloadFrame {  // what the Payload table declares about frames 1..n
  uint64_t bytes = 0;
  uint32_t crc = 0;
  uint32_t chunks = 0;
};

fb::Offset<fb::String> OptString(fb::FlatBufferBuilder& b, const std::string& s) {
  return s.empty() ? fb::Offset<fb::String>() : b.CreateString(s);
}

template <class T>
fb::Offset<fb::Vector<T>> OptVector(fb::FlatBufferBuilder& b, const std::vector<T>& v) {
  return v.empty() ? fb::Offset<fb::Vector<T>>() : b.CreateVector(v);
}

fb::Offset<w::Payload> WritePayload(fb::FlatBufferBuilder& b, const PayloadInfo& p,
                                    const PayloadFrame& f) {
  std::vector<fb::Offset<w::TensorDesc>> tensors;
  tensors.reserve(p.tensors.size());
  for (const TensorDescriptor& t : p.tensors) {
    auto name = OptString(b, t.name);
    w::TensorDescBuilder tb(b);
    tb.add_name(name);
    tb.add_offset(t.offset);
    tb.add_numel(t.numel);
    tb.add_encoded_bytes(t.encoded_bytes);
    tensors.push_back(tb.Finish());
  }
  auto tv = b.CreateVector(tensors);
  w::PayloadBuilder pb(b);
  pb.add_codec(static_cast<w::Codec>(p.codec));
  pb.add_block_size(static_cast<uint32_t>(p.block_size));
  pb.add_topk_fraction(p.topk_fraction);
  pb.add_tensors(tv);
  pb.add_payload_bytes(f.bytes);
  pb.add_payload_crc32c(f.crc);
  pb.add_num_chunks(f.chunks);
  return pb.Finish();
}

// Writes the body table; returns its offset (type is TypeOf(body)).
fb::Offset<void> WriteBody(fb::FlatBufferBuilder& b, const MessageBody& body,
                           const PayloadFrame& f) {
  switch (TypeOf(body)) {
    case MessageType::kHello: {
      const auto& m = std::get<HelloMsg>(body);
      auto build = OptString(b, m.build);
      w::HelloBuilder t(b);
      t.add_role(static_cast<w::Role>(m.role));
      t.add_tensor_table_digest(m.tensor_table_digest);
      t.add_num_params(m.num_params);
      t.add_param_dtype(static_cast<w::DType>(m.param_dtype));
      t.add_num_fragments(m.num_fragments);
      t.add_fragment_layout_digest(m.fragment_layout_digest);
      t.add_build(build);
      return t.Finish().Union();
    }
    case MessageType::kWelcome: {
      const auto& m = std::get<WelcomeMsg>(body);
      auto reason = OptString(b, m.reason);
      auto learner = OptString(b, m.learner);
      auto versions = OptVector(b, m.versions);
      w::WelcomeBuilder t(b);
      t.add_result(static_cast<w::JoinResult>(m.result));
      t.add_reason(reason);
      t.add_learner(learner);
      t.add_tensor_table_digest(m.tensor_table_digest);
      t.add_num_params(m.num_params);
      t.add_param_dtype(static_cast<w::DType>(m.param_dtype));
      t.add_num_fragments(m.num_fragments);
      t.add_fragment_layout_digest(m.fragment_layout_digest);
      t.add_versions(versions);
      t.add_heartbeat_interval_ms(m.heartbeat_interval_ms);
      t.add_heartbeat_timeout_ms(m.heartbeat_timeout_ms);
      return t.Finish().Union();
    }
    case MessageType::kHeartbeat: {
      const auto& m = std::get<HeartbeatMsg>(body);
      fb::Offset<fb::Vector<const w::FragmentCounters*>> fragments;
      if (!m.fragments.empty()) {
        std::vector<w::FragmentCounters> v;
        v.reserve(m.fragments.size());
        for (const FragmentCounters& c : m.fragments) {
          v.emplace_back(c.base_version, c.c_steps, c.c_tokens, c.fragment, c.in_flight);
        }
        fragments = b.CreateVectorOfStructs(v);
      }
      w::HeartbeatBuilder t(b);
      t.add_state(static_cast<w::LearnerState>(m.state));
      t.add_step(m.step);
      t.add_tokens(m.tokens);
      t.add_loss(m.loss);
      t.add_tokens_per_s(m.tokens_per_s);
      t.add_step_time_ms(m.step_time_ms);
      t.add_interval_ms(m.interval_ms);
      t.add_fragments(fragments);
      return t.Finish().Union();
    }
    case MessageType::kDelta: {
      const auto& m = std::get<DeltaMsg>(body);
      auto payload = WritePayload(b, m.payload, f);
      w::DeltaBuilder t(b);
      t.add_fragment(m.fragment);
      t.add_base_version(m.base_version);
      t.add_c_steps(m.c_steps);
      t.add_c_tokens(m.c_tokens);
      t.add_learner_step(m.learner_step);
      t.add_payload(payload);
      return t.Finish().Union();
    }
    case MessageType::kGlobal: {
      const auto& m = std::get<GlobalMsg>(body);
      fb::Offset<fb::Vector<fb::Offset<w::Contributor>>> contributors;
      if (!m.contributors.empty()) {
        std::vector<fb::Offset<w::Contributor>> v;
        for (const Contributor& c : m.contributors) {
          auto learner = OptString(b, c.learner);
          w::ContributorBuilder cb(b);
          cb.add_learner(learner);
          cb.add_base_version(c.base_version);
          cb.add_c_steps(c.c_steps);
          cb.add_c_tokens(c.c_tokens);
          cb.add_weight(c.weight);
          v.push_back(cb.Finish());
        }
        contributors = b.CreateVector(v);
      }
      auto payload = WritePayload(b, m.payload, f);
      w::GlobalBuilder t(b);
      t.add_fragment(m.fragment);
      t.add_version(m.version);
      t.add_base_version(m.base_version);
      t.add_is_full(m.is_full);
      t.add_fragment_crc32c(m.fragment_crc32c);
      t.add_contributors(contributors);
      t.add_payload(payload);
      return t.Finish().Union();
    }
    case MessageType::kSnapshotRequest: {
      const auto& m = std::get<SnapshotRequestMsg>(body);
      auto fragments = OptVector(b, m.fragments);
      auto reason = OptString(b, m.reason);
      w::SnapshotRequestBuilder t(b);
      t.add_request_id(m.request_id);
      t.add_fragments(fragments);
      t.add_reason(reason);
      return t.Finish().Union();
    }
    case MessageType::kSnapshot: {
      const auto& m = std::get<SnapshotMsg>(body);
      auto versions = OptVector(b, m.versions);
      auto payload = WritePayload(b, m.payload, f);
      w::SnapshotBuilder t(b);
      t.add_request_id(m.request_id);
      t.add_snapshot_id(m.snapshot_id);
      t.add_part(m.part);
      t.add_num_parts(m.num_parts);
      t.add_fragment(m.fragment);
      t.add_version(m.version);
      t.add_fragment_crc32c(m.fragment_crc32c);
      t.add_versions(versions);
      t.add_payload(payload);
      return t.Finish().Union();
    }
    case MessageType::kJobSpec: {
      const auto& m = std::get<JobSpecMsg>(body);
      auto yaml = b.CreateString(m.config_yaml);
      w::JobSpecBuilder t(b);
      t.add_config_yaml(yaml);
      return t.Finish().Union();
    }
    case MessageType::kControl: {
      const auto& m = std::get<ControlMsg>(body);
      fb::Offset<fb::Vector<fb::Offset<w::KeyValue>>> args;
      if (!m.args.empty()) {
        std::vector<fb::Offset<w::KeyValue>> v;
        for (const KeyValue& kv : m.args) {
          auto key = b.CreateString(kv.key);
          auto value = OptString(b, kv.value);
          w::KeyValueBuilder kb(b);
          kb.add_key(key);
          kb.add_value(value);
          v.push_back(kb.Finish());
        }
        args = b.CreateVector(v);
      }
      auto name = b.CreateString(m.name);
      w::ControlBuilder t(b);
      t.add_name(name);
      t.add_request_id(m.request_id);
      t.add_args(args);
      return t.Finish().Union();
    }
    case MessageType::kSyncerStatus: {
      const auto& m = std::get<SyncerStatusMsg>(body);
      auto versions = OptVector(b, m.versions);
      fb::Offset<fb::Vector<fb::Offset<fb::String>>> live;
      if (!m.live_learners.empty()) live = b.CreateVectorOfStrings(m.live_learners);
      auto live_steps = OptVector(b, m.live_steps);
      fb::Offset<fb::Vector<fb::Offset<w::DroppedDelta>>> drops;
      if (!m.recent_drops.empty()) {
        std::vector<fb::Offset<w::DroppedDelta>> v;
        for (const DroppedDelta& d : m.recent_drops) {
          auto learner = OptString(b, d.learner);
          auto reason = OptString(b, d.reason);
          w::DroppedDeltaBuilder db(b);
          db.add_learner(learner);
          db.add_fragment(d.fragment);
          db.add_base_version(d.base_version);
          db.add_reason(reason);
          v.push_back(db.Finish());
        }
        drops = b.CreateVector(v);
      }
      fb::Offset<fb::Vector<fb::Offset<w::LearnerAck>>> acks;
      if (!m.acks.empty()) {
        std::vector<fb::Offset<w::LearnerAck>> v;
        for (const LearnerAck& a : m.acks) {
          auto learner = OptString(b, a.learner);
          auto fragments = OptVector(b, a.pending_fragments);
          auto bases = OptVector(b, a.pending_bases);
          w::LearnerAckBuilder ab(b);
          ab.add_learner(learner);
          ab.add_incarnation(a.incarnation);
          ab.add_heard_seq(a.heard_seq);
          ab.add_pending_fragments(fragments);
          ab.add_pending_bases(bases);
          v.push_back(ab.Finish());
        }
        acks = b.CreateVector(v);
      }
      w::SyncerStatusBuilder t(b);
      t.add_acks(acks);
      t.add_versions(versions);
      t.add_live_learners(live);
      t.add_merges(m.merges);
      t.add_dropped_deltas(m.dropped_deltas);
      t.add_recent_drops(drops);
      t.add_live_steps(live_steps);
      return t.Finish().Union();
    }
  }
  return fb::Offset<void>();
}

void AppendCrcTrailer(std::vector<uint8_t>* header) {
  const uint32_t crc = Crc32c(header->data(), header->size());
  for (int i = 0; i < 4; ++i) header->push_back(static_cast<uint8_t>(crc >> (8 * i)));
}

void WriteMessage(const EnvelopeHeader& h, const MessageBody& body, uint8_t body_type,
                  std::span<const uint8_t> payload, const PayloadFrame& f, size_t chunk_bytes,
                  OutgoingMessage* out) {
  size_t estimate = 256 + h.job_id.size() + h.sender.size();
  if (const PayloadInfo* p = PayloadOf(body)) estimate += 64 * p->tensors.size();
  fb::FlatBufferBuilder b(estimate);
  auto body_offset = WriteBody(b, body, f);
  auto job = b.CreateString(h.job_id);
  auto sender = b.CreateString(h.sender);
  w::EnvelopeBuilder eb(b);
  eb.add_protocol_version(h.protocol_version);
  eb.add_job_id(job);
  eb.add_sender(sender);
  eb.add_seq(h.seq);
  eb.add_incarnation(h.incarnation);
  eb.add_sent_unix_ms(h.sent_unix_ms);
  eb.add_body_type(static_cast<w::Body>(body_type));
  eb.add_body(body_offset);
  w::FinishEnvelopeBuffer(b, eb.Finish());
  out->header.assign(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  AppendCrcTrailer(&out->header);
  out->chunks.clear();
  for (size_t pos = 0; pos < payload.size(); pos += chunk_bytes) {
    out->chunks.push_back(payload.subspan(pos, std::min(chunk_bytes, payload.size() - pos)));
  }
}

// ---------------------------------------------------------------------------------------------
// Parse: FlatBuffer (verified) -> plain structs, with list and string sizes bounded first.

std::string ReadString(const fb::String* s) {
  return s ? std::string(s->c_str(), s->size()) : std::string();
}

// Strings are bounded by the header size (<= max_header_bytes), so copying them is bounded;
// their content is checked by CheckBody.
template <class T>
std::vector<T> ReadScalars(const fb::Vector<T>* v) {
  return v ? std::vector<T>(v->begin(), v->end()) : std::vector<T>();
}

Status ReadPayload(const w::Payload* p, const ParseOptions& o, std::string_view who,
                   PayloadInfo* info, PayloadFrame* f) {
  if (p == nullptr) return Status::Error(std::string(who) + ": no payload description");
  const uint8_t codec = static_cast<uint8_t>(p->codec());
  if (!IsValidCodecKind(codec)) {
    return Status::Error(std::string(who) + ": codec " + Str(codec) + " is unknown (valid: 1 fp32, 2 bf16, 3 int8, 4 int4)");
  }
  info->codec = static_cast<CodecKind>(codec);
  if (p->block_size() > static_cast<uint32_t>(kMaxBlock)) {
    return Status::Error(std::string(who) + ": block size " + Str(p->block_size()) + " is not an even number in [2, 65536]");
  }
  info->block_size = static_cast<int>(p->block_size());
  info->topk_fraction = p->topk_fraction();
  const auto* tensors = p->tensors();  // required: the Verifier saw it
  DL_RETURN_IF_ERROR(CheckListSize(tensors->size(), o.max_tensors, who, "tensor list"));
  info->tensors.resize(tensors->size());
  for (fb::uoffset_t i = 0; i < tensors->size(); ++i) {
    const w::TensorDesc* t = tensors->Get(i);
    TensorDescriptor& d = info->tensors[i];
    d.name = ReadString(t->name());
    d.offset = t->offset();
    d.numel = t->numel();
    d.encoded_bytes = t->encoded_bytes();
  }
  f->bytes = p->payload_bytes();
  f->crc = p->payload_crc32c();
  f->chunks = p->num_chunks();
  return Status::Ok();
}

Status ReadBody(const w::Envelope* env, MessageType type, const ParseOptions& o,
                std::string_view who, MessageBody* body, PayloadFrame* f) {
  switch (type) {
    case MessageType::kHello: {
      const auto* t = env->body_as_Hello();
      HelloMsg m;
      m.role = static_cast<PeerRole>(t->role());
      m.tensor_table_digest = t->tensor_table_digest();
      m.num_params = t->num_params();
      m.param_dtype = static_cast<ParamDType>(t->param_dtype());
      m.num_fragments = t->num_fragments();
      m.fragment_layout_digest = t->fragment_layout_digest();
      m.build = ReadString(t->build());
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kWelcome: {
      const auto* t = env->body_as_Welcome();
      WelcomeMsg m;
      m.result = static_cast<JoinResult>(t->result());
      m.reason = ReadString(t->reason());
      m.learner = ReadString(t->learner());
      m.tensor_table_digest = t->tensor_table_digest();
      m.num_params = t->num_params();
      m.param_dtype = static_cast<ParamDType>(t->param_dtype());
      m.num_fragments = t->num_fragments();
      m.fragment_layout_digest = t->fragment_layout_digest();
      if (t->versions()) DL_RETURN_IF_ERROR(CheckListSize(t->versions()->size(), o.max_fragments, who, "versions"));
      m.versions = ReadScalars(t->versions());
      m.heartbeat_interval_ms = t->heartbeat_interval_ms();
      m.heartbeat_timeout_ms = t->heartbeat_timeout_ms();
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kHeartbeat: {
      const auto* t = env->body_as_Heartbeat();
      HeartbeatMsg m;
      m.state = static_cast<LearnerState>(t->state());
      m.step = t->step();
      m.tokens = t->tokens();
      m.loss = t->loss();
      m.tokens_per_s = t->tokens_per_s();
      m.step_time_ms = t->step_time_ms();
      m.interval_ms = t->interval_ms();
      if (const auto* v = t->fragments()) {
        DL_RETURN_IF_ERROR(CheckListSize(v->size(), o.max_fragments, who, "fragment counters"));
        m.fragments.reserve(v->size());
        for (const w::FragmentCounters* c : *v) {
          m.fragments.push_back({c->fragment(), c->base_version(), c->c_steps(), c->c_tokens(), c->in_flight()});
        }
      }
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kDelta: {
      const auto* t = env->body_as_Delta();
      DeltaMsg m;
      m.fragment = t->fragment();
      m.base_version = t->base_version();
      m.c_steps = t->c_steps();
      m.c_tokens = t->c_tokens();
      m.learner_step = t->learner_step();
      DL_RETURN_IF_ERROR(ReadPayload(t->payload(), o, who, &m.payload, f));
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kGlobal: {
      const auto* t = env->body_as_Global();
      GlobalMsg m;
      m.fragment = t->fragment();
      m.version = t->version();
      m.base_version = t->base_version();
      m.is_full = t->is_full();
      m.fragment_crc32c = t->fragment_crc32c();
      if (const auto* v = t->contributors()) {
        DL_RETURN_IF_ERROR(CheckListSize(v->size(), o.max_list, who, "contributors"));
        m.contributors.reserve(v->size());
        for (const w::Contributor* c : *v) {
          m.contributors.push_back({ReadString(c->learner()), c->base_version(), c->c_steps(), c->c_tokens(), c->weight()});
        }
      }
      DL_RETURN_IF_ERROR(ReadPayload(t->payload(), o, who, &m.payload, f));
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kSnapshotRequest: {
      const auto* t = env->body_as_SnapshotRequest();
      SnapshotRequestMsg m;
      m.request_id = t->request_id();
      if (t->fragments()) DL_RETURN_IF_ERROR(CheckListSize(t->fragments()->size(), o.max_fragments, who, "fragments"));
      m.fragments = ReadScalars(t->fragments());
      m.reason = ReadString(t->reason());
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kSnapshot: {
      const auto* t = env->body_as_Snapshot();
      SnapshotMsg m;
      m.request_id = t->request_id();
      m.snapshot_id = t->snapshot_id();
      m.part = t->part();
      m.num_parts = t->num_parts();
      m.fragment = t->fragment();
      m.version = t->version();
      m.fragment_crc32c = t->fragment_crc32c();
      if (t->versions()) DL_RETURN_IF_ERROR(CheckListSize(t->versions()->size(), o.max_fragments, who, "versions"));
      m.versions = ReadScalars(t->versions());
      DL_RETURN_IF_ERROR(ReadPayload(t->payload(), o, who, &m.payload, f));
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kJobSpec: {
      JobSpecMsg m;
      m.config_yaml = ReadString(env->body_as_JobSpec()->config_yaml());
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kControl: {
      const auto* t = env->body_as_Control();
      ControlMsg m;
      m.name = ReadString(t->name());
      m.request_id = t->request_id();
      if (const auto* v = t->args()) {
        DL_RETURN_IF_ERROR(CheckListSize(v->size(), o.max_list, who, "args"));
        m.args.reserve(v->size());
        for (const w::KeyValue* kv : *v) m.args.push_back({ReadString(kv->key()), ReadString(kv->value())});
      }
      *body = std::move(m);
      return Status::Ok();
    }
    case MessageType::kSyncerStatus: {
      const auto* t = env->body_as_SyncerStatus();
      SyncerStatusMsg m;
      if (t->versions()) DL_RETURN_IF_ERROR(CheckListSize(t->versions()->size(), o.max_fragments, who, "versions"));
      m.versions = ReadScalars(t->versions());
      if (const auto* v = t->live_learners()) {
        DL_RETURN_IF_ERROR(CheckListSize(v->size(), o.max_list, who, "live learners"));
        m.live_learners.reserve(v->size());
        for (const fb::String* s : *v) m.live_learners.push_back(ReadString(s));
      }
      if (t->live_steps()) DL_RETURN_IF_ERROR(CheckListSize(t->live_steps()->size(), o.max_list, who, "live steps"));
      m.live_steps = ReadScalars(t->live_steps());
      m.merges = t->merges();
      m.dropped_deltas = t->dropped_deltas();
      if (const auto* v = t->recent_drops()) {
        DL_RETURN_IF_ERROR(CheckListSize(v->size(), o.max_list, who, "recent drops"));
        m.recent_drops.reserve(v->size());
        for (const w::DroppedDelta* d : *v) {
          m.recent_drops.push_back({ReadString(d->learner()), d->fragment(), d->base_version(), ReadString(d->reason())});
        }
      }
      if (const auto* v = t->acks()) {
        DL_RETURN_IF_ERROR(CheckListSize(v->size(), o.max_list, who, "acks"));
        m.acks.reserve(v->size());
        for (const w::LearnerAck* a : *v) {
          if (a->pending_fragments())
            DL_RETURN_IF_ERROR(CheckListSize(a->pending_fragments()->size(), o.max_fragments, who, "ack pending"));
          if (a->pending_bases())
            DL_RETURN_IF_ERROR(CheckListSize(a->pending_bases()->size(), o.max_fragments, who, "ack pending bases"));
          m.acks.push_back({ReadString(a->learner()), a->incarnation(), a->heard_seq(),
                            ReadScalars(a->pending_fragments()), ReadScalars(a->pending_bases())});
        }
      }
      *body = std::move(m);
      return Status::Ok();
    }
  }
  return Status::Error(std::string(who) + ": unknown body");
}

// CRC32C of a payload, one chunk at a time from the last: a payload just written by an encoder
// (or just sent) has its end in cache, which a forward pass would evict before reaching it.
uint32_t PayloadCrc32c(std::span<const uint8_t> payload) {
  uint32_t crc = 0;
  uint64_t tail = 0;
  for (size_t end = payload.size(); end > 0;) {
    const size_t begin = end > kChunkBytes ? end - kChunkBytes : 0;
    crc = Crc32cCombine(Crc32c(payload.data() + begin, end - begin), crc, tail);
    tail += end - begin;
    end = begin;
  }
  return crc;
}

// For every payload message: tensors' byte offsets in the payload.
void FillTensorOffsets(const PayloadInfo* p, std::vector<uint64_t>* offsets) {
  offsets->clear();
  if (p == nullptr) return;
  offsets->reserve(p->tensors.size() + 1);
  uint64_t pos = 0;
  offsets->push_back(0);
  for (const TensorDescriptor& t : p->tensors) {
    pos += t.encoded_bytes;
    offsets->push_back(pos);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API

std::string_view MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kHello: return "hello";
    case MessageType::kWelcome: return "welcome";
    case MessageType::kHeartbeat: return "heartbeat";
    case MessageType::kDelta: return "delta";
    case MessageType::kGlobal: return "global";
    case MessageType::kSnapshotRequest: return "snapshot request";
    case MessageType::kSnapshot: return "snapshot";
    case MessageType::kJobSpec: return "job spec";
    case MessageType::kControl: return "control";
    case MessageType::kSyncerStatus: return "syncer status";
  }
  return "unknown message";
}

MessageType TypeOf(const MessageBody& body) { return static_cast<MessageType>(body.index() + 1); }

const PayloadInfo* PayloadOf(const MessageBody& body) {
  if (const auto* m = std::get_if<DeltaMsg>(&body)) return &m->payload;
  if (const auto* m = std::get_if<GlobalMsg>(&body)) return &m->payload;
  if (const auto* m = std::get_if<SnapshotMsg>(&body)) return &m->payload;
  return nullptr;
}

bool HeartbeatMsg::operator==(const HeartbeatMsg& o) const {
  const bool same_loss = (std::isnan(loss) && std::isnan(o.loss)) || loss == o.loss;
  return state == o.state && step == o.step && tokens == o.tokens && same_loss &&
         tokens_per_s == o.tokens_per_s && step_time_ms == o.step_time_ms &&
         interval_ms == o.interval_ms && fragments == o.fragments;
}

size_t OutgoingMessage::wire_bytes() const {
  size_t n = header.size();
  for (const auto& c : chunks) n += c.size();
  return n;
}

std::span<const uint8_t> ParsedMessage::tensor_bytes(size_t i) const {
  if (i + 1 >= tensor_payload_offsets.size()) return {};
  const uint64_t begin = tensor_payload_offsets[i];
  const uint64_t end = tensor_payload_offsets[i + 1];
  if (payload.size() >= end) return std::span<const uint8_t>(payload.data() + begin, end - begin);
  // In place: chunks are kChunkBytes each but the last.
  const uint64_t c = begin / kChunkBytes;
  if (end == begin || c >= payload_chunks.size() || (end - 1) / kChunkBytes != c) return {};
  return payload_chunks[c].subspan(begin - c * kChunkBytes, end - begin);
}

uint64_t ParsedMessage::payload_size() const {
  uint64_t n = payload.size();
  for (const auto& c : payload_chunks) n += c.size();
  return n;
}

std::vector<std::span<const uint8_t>> ParsedMessage::payload_spans() const {
  if (!payload_chunks.empty()) return payload_chunks;
  if (payload.empty()) return {};
  return {std::span<const uint8_t>(payload.data(), payload.size())};
}

void ParsedMessage::MakeContiguous() {
  if (payload_chunks.empty()) return;
  payload.resize(payload_size());
  uint64_t pos = 0;
  for (const auto& c : payload_chunks) {
    std::memcpy(payload.data() + pos, c.data(), c.size());
    pos += c.size();
  }
  payload_chunks.clear();
  payload_owner.reset();
}

Status BuildMessage(const EnvelopeHeader& header, const MessageBody& body,
                    std::span<const uint8_t> payload, OutgoingMessage* out) {
  const MessageType type = TypeOf(body);
  const std::string who = "building " + MessageWho(type, header.sender);
  ParseOptions o;
  o.min_protocol_version = o.max_protocol_version = header.protocol_version;
  o.any_job = true;
  o.model_params = kMaxModelParams;
  DL_RETURN_IF_ERROR(CheckHeader(header, o, who));
  uint64_t payload_bytes = 0;
  DL_RETURN_IF_ERROR(CheckBody(body, o, who, &payload_bytes));
  if (payload.size() != payload_bytes) {
    return Status::Error(who + ": the tensors' encoded bytes sum to " + Str(payload_bytes) +
                         " but the payload has " + Str(payload.size()));
  }
  PayloadFrame f;
  f.bytes = payload.size();
  f.crc = PayloadCrc32c(payload);
  f.chunks = static_cast<uint32_t>(CeilDiv(payload.size(), kChunkBytes));
  if (const auto* s = std::get_if<SnapshotMsg>(&body); s && s->fragment_crc32c != f.crc) {
    return Status::Error(who + ": fragment CRC32C " + Str(s->fragment_crc32c) +
                         " is not the CRC32C of its fp32 values (" + Str(f.crc) + ")");
  }
  WriteMessage(header, body, static_cast<uint8_t>(type), payload, f, kChunkBytes, out);
  if (out->header.size() > o.max_header_bytes) {
    return Status::Error(who + ": header of " + Str(out->header.size()) +
                         " bytes exceeds the receivers' limit of " + Str(o.max_header_bytes));
  }
  return Status::Ok();
}

void BuildMessageUnchecked(const EnvelopeHeader& header, const MessageBody& body,
                           std::span<const uint8_t> payload, const RawOverrides& raw,
                           OutgoingMessage* out) {
  PayloadFrame f;
  f.bytes = raw.payload_bytes.value_or(payload.size());
  f.crc = raw.payload_crc32c.value_or(payload.empty() ? 0 : Crc32c(payload.data(), payload.size()));
  f.chunks = raw.num_chunks.value_or(static_cast<uint32_t>(CeilDiv(payload.size(), kChunkBytes)));
  const uint8_t type = raw.body_type.value_or(static_cast<uint8_t>(TypeOf(body)));
  WriteMessage(header, body, type, payload, f, raw.chunk_bytes == 0 ? kChunkBytes : raw.chunk_bytes,
               out);
}

void ResealHeader(std::vector<uint8_t>* frame0) {
  if (frame0->size() < kHeaderCrcBytes) return;
  frame0->resize(frame0->size() - kHeaderCrcBytes);
  AppendCrcTrailer(frame0);
}

namespace {

Status CheckChunkSizes(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                       std::string_view what) {
  const uint64_t want = CeilDiv(payload_bytes, kChunkBytes);
  if (chunks.size() != want) {
    return Status::Error(std::string(what) + ": " + Str(chunks.size()) + " payload frames for " +
                         Str(payload_bytes) + " bytes (want " + Str(want) + " of at most 4 MiB)");
  }
  // Sizes first: nothing is allocated for a payload whose frames do not add up.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const uint64_t expect = i + 1 < chunks.size() ? kChunkBytes : payload_bytes - i * kChunkBytes;
    if (chunks[i].size() != expect) {
      return Status::Error(std::string(what) + ": payload frame " + Str(i + 1) + " of " +
                           Str(chunks.size()) + " has " + Str(chunks[i].size()) +
                           " bytes, want " + Str(expect));
    }
  }
  return Status::Ok();
}

Status CrcMismatch(std::string_view what, uint64_t payload_bytes, uint32_t declared, uint32_t computed) {
  return Status::Error(std::string(what) + ": payload CRC32C mismatch (declared " + Str(declared) +
                       ", computed " + Str(computed) + " over " + Str(payload_bytes) +
                       " bytes): corrupted in transit, drop it");
}

}  // namespace

Status VerifyChunks(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                    uint32_t payload_crc32c, std::string_view what) {
  DL_RETURN_IF_ERROR(CheckChunkSizes(chunks, payload_bytes, what));
  // Last chunk first: the receiver's I/O thread wrote it last, so it is the part most likely
  // still in cache; reading forward would evict it before reaching it. The chunk CRCs are
  // combined into the payload's.
  uint32_t crc = 0;
  uint64_t tail = 0;  // bytes after the current chunk
  for (size_t i = chunks.size(); i-- > 0;) {
    const uint32_t c = Crc32c(chunks[i].data(), chunks[i].size());
    crc = Crc32cCombine(c, crc, tail);
    tail += chunks[i].size();
  }
  if (crc != payload_crc32c) return CrcMismatch(what, payload_bytes, payload_crc32c, crc);
  return Status::Ok();
}

Status ReassembleChunks(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                        uint32_t payload_crc32c, std::string_view what,
                        ParsedMessage::Bytes* out) {
  DL_RETURN_IF_ERROR(CheckChunkSizes(chunks, payload_bytes, what));
  out->resize(payload_bytes);
  uint32_t crc = 0;
  uint64_t pos = 0;
  for (const auto& c : chunks) {
    // One pass over each chunk: copy and CRC together.
    crc = Crc32cCopy(out->data() + pos, c.data(), c.size(), crc);
    pos += c.size();
  }
  if (crc != payload_crc32c) return CrcMismatch(what, payload_bytes, payload_crc32c, crc);
  return Status::Ok();
}

namespace {

// ParseEnvelope (copies the payload) and ParseEnvelopeInPlace (in_place: keeps it in the frames).
Status Parse(std::span<const std::span<const uint8_t>> frames, const ParseOptions& o, bool in_place,
             std::shared_ptr<const void> owner, ParsedMessage* out) {
  out->payload_chunks.clear();
  out->payload_owner.reset();
  if (frames.empty()) return Status::Error("envelope: empty message (no frames)");
  const std::span<const uint8_t> frame0 = frames[0];
  const std::string anon = "envelope of " + Str(frame0.size()) + " bytes";
  // 1. Size, header CRC, identifier.
  if (frame0.size() < kMinFlatBufferBytes + kHeaderCrcBytes) {
    return Status::Error(anon + ": too short for a header");
  }
  const size_t max_header = std::min<size_t>(o.max_header_bytes, FLATBUFFERS_MAX_BUFFER_SIZE - 1);
  if (frame0.size() > max_header) {
    return Status::Error(anon + ": header larger than the limit of " + Str(max_header) + " bytes");
  }
  const size_t fb_size = frame0.size() - kHeaderCrcBytes;
  uint32_t declared_crc = 0;
  for (int i = 0; i < 4; ++i) declared_crc |= uint32_t{frame0[fb_size + i]} << (8 * i);
  if (Crc32c(frame0.data(), fb_size) != declared_crc) {
    return Status::Error(anon + ": header CRC32C mismatch: corrupted in transit or not a "
                         "dilocod message");
  }
  if (!w::EnvelopeBufferHasIdentifier(frame0.data())) {
    return Status::Error(anon + ": file identifier is not \"" + w::EnvelopeIdentifier() +
                         "\": not a dilocod envelope");
  }
  // FlatBuffers reads scalars in place: keep the buffer 8-byte aligned.
  const uint8_t* buf = frame0.data();
  thread_local std::vector<uint64_t> aligned;
  if (reinterpret_cast<uintptr_t>(buf) % 8 != 0) {
    aligned.resize((fb_size + 7) / 8);
    std::memcpy(aligned.data(), buf, fb_size);
    buf = reinterpret_cast<const uint8_t*>(aligned.data());
  }
  // 2. Verifier.
  fb::Verifier::Options vo;
  vo.max_depth = 16;
  vo.max_tables = o.max_tensors + 3 * o.max_list + 64;
  vo.check_alignment = true;
  fb::Verifier verifier(buf, fb_size, vo);
  if (!w::VerifyEnvelopeBuffer(verifier)) {
    return Status::Error(anon + ": FlatBuffers verification failed (malformed, or beyond the "
                         "depth/table limits)");
  }
  const w::Envelope* env = w::GetEnvelope(buf);
  // 3. Body type, header fields.
  const std::string sender = ReadString(env->sender());
  const auto raw_type = static_cast<uint8_t>(env->body_type());
  if (raw_type == 0 || raw_type > kNumMessageTypes) {
    return Status::Error("envelope from " + Printable(sender) + ": body type " + Str(raw_type) +
                         (raw_type == 0 ? " (none)" : " is unknown (a newer protocol?)"));
  }
  const auto type = static_cast<MessageType>(raw_type);
  const std::string who = MessageWho(type, sender);
  if (env->body() == nullptr) return Status::Error(who + ": body is missing");
  out->header.protocol_version = env->protocol_version();
  out->header.job_id = ReadString(env->job_id());
  out->header.sender = sender;
  out->header.seq = env->seq();
  out->header.incarnation = env->incarnation();
  out->header.sent_unix_ms = env->sent_unix_ms();
  DL_RETURN_IF_ERROR(CheckHeader(out->header, o, who));
  if ((o.accept & MessageBit(type)) == 0) {
    return Status::Error(who + ": this socket does not accept " +
                         std::string(MessageTypeName(type)) + " messages");
  }
  // 4. Body: copy out (lists bounded), then semantics.
  PayloadFrame f;
  DL_RETURN_IF_ERROR(ReadBody(env, type, o, who, &out->body, &f));
  uint64_t payload_bytes = 0;
  DL_RETURN_IF_ERROR(CheckBody(out->body, o, who, &payload_bytes));
  const PayloadInfo* info = PayloadOf(out->body);
  const std::span<const std::span<const uint8_t>> chunks = frames.subspan(1);
  if (info == nullptr) {
    if (!chunks.empty()) {
      return Status::Error(who + ": " + Str(chunks.size()) +
                           " unexpected payload frames (this message has no payload)");
    }
    out->payload.clear();
    out->payload_crc32c = 0;
  } else {
    if (f.bytes != payload_bytes) {
      return Status::Error(who + ": declares " + Str(f.bytes) +
                           " payload bytes but its tensors' encoded bytes sum to " +
                           Str(payload_bytes));
    }
    if (f.chunks != chunks.size()) {
      return Status::Error(who + ": declares " + Str(f.chunks) + " payload frames, got " +
                           Str(chunks.size()));
    }
    // 5. Chunks and CRC.
    if (in_place) {
      out->payload.clear();
      DL_RETURN_IF_ERROR(VerifyChunks(chunks, f.bytes, f.crc, who));
      out->payload_chunks.assign(chunks.begin(), chunks.end());
      out->payload_owner = std::move(owner);
    } else {
      DL_RETURN_IF_ERROR(ReassembleChunks(chunks, f.bytes, f.crc, who, &out->payload));
    }
    out->payload_crc32c = f.crc;
    if (const auto* s = std::get_if<SnapshotMsg>(&out->body); s && s->fragment_crc32c != f.crc) {
      return Status::Error(who + ": fragment CRC32C differs from the CRC32C of its fp32 values");
    }
  }
  FillTensorOffsets(info, &out->tensor_payload_offsets);
  out->wire_bytes = frame0.size() + payload_bytes;
  return Status::Ok();
}

}  // namespace

Status ParseEnvelope(std::span<const std::span<const uint8_t>> frames, const ParseOptions& o,
                     ParsedMessage* out) {
  return Parse(frames, o, false, nullptr, out);
}

Status ParseEnvelopeInPlace(std::span<const std::span<const uint8_t>> frames, const ParseOptions& o,
                            std::shared_ptr<const void> frames_owner, ParsedMessage* out) {
  return Parse(frames, o, true, std::move(frames_owner), out);
}

// ---------------------------------------------------------------------------------------------
// SnapshotAssembler

SnapshotAssembler::SnapshotAssembler(uint64_t request_id, uint64_t max_total_bytes)
    : request_id_(request_id), max_total_bytes_(max_total_bytes) {}

Status SnapshotAssembler::Add(ParsedMessage&& part) {
  part.MakeContiguous();  // parts outlive the frames they were received in
  const SnapshotMsg* s = part.get<SnapshotMsg>();
  if (s == nullptr) {
    return Status::Error("snapshot assembly: got a " + std::string(MessageTypeName(part.type())) +
                         " from " + Printable(part.header.sender) + ", not a snapshot part");
  }
  const std::string who = "snapshot part " + Str(s->part) + " from " + Printable(part.header.sender);
  if (s->request_id != request_id_) {
    return Status::Error(who + ": answers request " + Str(s->request_id) + ", not " + Str(request_id_));
  }
  if (s->num_parts == 0 || s->part >= s->num_parts || s->fragment >= s->versions.size() ||
      part.tensor_payload_offsets.empty() ||
      part.payload.size() != part.tensor_payload_offsets.back()) {
    return Status::Error(who + ": not a parsed snapshot part (use ParseEnvelope first)");
  }
  if (num_parts_ > 0) {
    if (s->snapshot_id != snapshot_id_) {
      return Status::Error(who + ": belongs to snapshot " + Str(s->snapshot_id) + ", not " + Str(snapshot_id_));
    }
    if (s->num_parts != num_parts_) {
      return Status::Error(who + ": says " + Str(s->num_parts) + " parts, earlier parts said " + Str(num_parts_));
    }
    if (s->versions != versions_) {
      return Status::Error(who + ": its fragment versions differ from the earlier parts'");
    }
    if (have_part_[s->part]) return Status::Error(who + ": duplicate part");
    if (have_fragment_[s->fragment]) {
      return Status::Error(who + ": fragment " + Str(s->fragment) + " already received");
    }
  }
  if (part.payload.size() > max_total_bytes_ - std::min(total_bytes_, max_total_bytes_)) {
    return Status::Error(who + ": snapshot exceeds " + Str(max_total_bytes_) + " bytes");
  }
  // Tensor ranges of all parts must be disjoint.
  std::vector<std::pair<uint64_t, uint64_t>> merged = ranges_;
  for (const TensorDescriptor& t : s->payload.tensors) merged.emplace_back(t.offset, t.offset + t.numel);
  std::sort(merged.begin(), merged.end());
  for (size_t i = 1; i < merged.size(); ++i) {
    if (merged[i].first < merged[i - 1].second) {
      return Status::Error(who + ": parameter range [" + Str(merged[i].first) + ", " +
                           Str(merged[i].second) + ") overlaps another part's");
    }
  }
  // Accept.
  if (num_parts_ == 0) {
    snapshot_id_ = s->snapshot_id;
    num_parts_ = s->num_parts;
    versions_ = s->versions;
    parts_.resize(num_parts_);
    have_part_.assign(num_parts_, false);
    have_fragment_.assign(versions_.size(), false);
  }
  have_part_[s->part] = true;
  have_fragment_[s->fragment] = true;
  ranges_ = std::move(merged);
  total_bytes_ += part.payload.size();
  const uint32_t index = s->part;
  parts_[index] = std::move(part);
  ++parts_received_;
  return Status::Ok();
}

std::vector<ParsedMessage> SnapshotAssembler::Take() {
  if (!complete()) return {};
  std::vector<ParsedMessage> out = std::move(parts_);
  *this = SnapshotAssembler(request_id_, max_total_bytes_);
  return out;
}

}  // namespace diloco
