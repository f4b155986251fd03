// The semantic check of each message, one function per message (the fields themselves and the
// bounds of their lists come from proto/dilocod.fbs). BuildMessage and ParseEnvelope both run
// these, so a bad message fails at its sender, not at every receiver.
#include <algorithm>
#include <cmath>
#include <variant>

#include "daemon/net/envelope_checks.h"

namespace diloco::wire_io {
namespace {

Status Invalid(std::string_view who, std::string_view what, uint8_t value) {
  return Status::Error(std::string(who) + ": " + std::string(what) + " " + Str(value) + " is invalid");
}

template <class E>
uint8_t Raw(E e) {
  return static_cast<uint8_t>(e);
}

// Hello and Welcome describe the same model.
Status CheckModelShape(ParamDType dtype, uint64_t num_params, uint32_t num_fragments,
                       const ParseOptions& o, std::string_view who) {
  if (!IsValid(dtype)) return Invalid(who, "parameter dtype", Raw(dtype));
  if (num_params > kMaxModelParams) {
    return Status::Error(std::string(who) + ": " + Str(num_params) + " parameters is more than the limit " +
                         Str(kMaxModelParams));
  }
  if (num_fragments > o.max_fragments) {
    return Status::Error(std::string(who) + ": " + Str(num_fragments) +
                         " fragments is more than max_fragments " + Str(o.max_fragments));
  }
  return Status::Ok();
}

// *payload_bytes = the sum of the tensors' encoded bytes.
Status CheckPayloadInfo(const PayloadInfo& p, const ParseOptions& o, std::string_view who,
                        uint64_t* payload_bytes) {
  if (!IsValidCodecKind(Raw(p.codec))) {
    return Status::Error(std::string(who) + ": codec " + Str(Raw(p.codec)) +
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

// ---- One check per message, in the schema's order. ----

Status Check(const HelloMsg& m, const ParseOptions& o, std::string_view who, uint64_t*) {
  if (!IsValid(m.role)) return Invalid(who, "role", Raw(m.role));
  DL_RETURN_IF_ERROR(CheckModelShape(m.param_dtype, m.num_params, m.num_fragments, o, who));
  return CheckText(m.build, kMaxTextBytes, who, "build");
}

Status Check(const WelcomeMsg& m, const ParseOptions& o, std::string_view who, uint64_t*) {
  if (!IsValid(m.result)) return Invalid(who, "join result", Raw(m.result));
  if (m.result != JoinResult::kAccepted && m.reason.empty()) {
    return Status::Error(std::string(who) + ": refusal without a reason");
  }
  DL_RETURN_IF_ERROR(CheckText(m.reason, kMaxTextBytes, who, "reason"));
  DL_RETURN_IF_ERROR(CheckIdentifier(m.learner, kMaxNameBytes, false, who, "learner"));
  DL_RETURN_IF_ERROR(CheckModelShape(m.param_dtype, m.num_params, m.num_fragments, o, who));
  if (m.result == JoinResult::kAccepted && m.versions.size() != m.num_fragments) {
    return Status::Error(std::string(who) + ": " + Str(m.versions.size()) + " versions for " +
                         Str(m.num_fragments) + " fragments");
  }
  return Status::Ok();
}

Status Check(const HeartbeatMsg& m, const ParseOptions& o, std::string_view who, uint64_t*) {
  if (!IsValid(m.state)) return Invalid(who, "learner state", Raw(m.state));
  if (std::isinf(m.loss)) return Status::Error(std::string(who) + ": loss is infinite");
  DL_RETURN_IF_ERROR(CheckFiniteNonNegative(m.tokens_per_s, who, "tokens_per_s"));
  DL_RETURN_IF_ERROR(CheckFiniteNonNegative(m.step_time_ms, who, "step_time_ms"));
  std::vector<uint32_t> fragments;
  fragments.reserve(m.fragments.size());
  for (const FragmentCounters& c : m.fragments) fragments.push_back(c.fragment);
  return CheckFragmentSet(std::move(fragments), o, who, "fragment counters");
}

Status Check(const DeltaMsg& m, const ParseOptions& o, std::string_view who, uint64_t* payload_bytes) {
  DL_RETURN_IF_ERROR(CheckFragment(m.fragment, o, who));
  if (m.c_steps == 0) {
    return Status::Error(std::string(who) + ": c_steps is 0 (a delta comes from at least one inner step)");
  }
  return CheckPayloadInfo(m.payload, o, who, payload_bytes);
}

Status Check(const GlobalMsg& m, const ParseOptions& o, std::string_view who, uint64_t* payload_bytes) {
  DL_RETURN_IF_ERROR(CheckFragment(m.fragment, o, who));
  if (m.version == 0) return Status::Error(std::string(who) + ": version 0 (versions start at 1)");
  if (m.is_full && m.base_version != 0) {
    return Status::Error(std::string(who) + ": a full fragment with base version " +
                         Str(m.base_version) + " (must be 0)");
  }
  if (!m.is_full && m.base_version != m.version - 1) {
    return Status::Error(std::string(who) + ": an update to version " + Str(m.version) +
                         " on top of version " + Str(m.base_version) + " (must be " +
                         Str(m.version - 1) + ")");
  }
  for (size_t i = 0; i < m.contributors.size(); ++i) {
    const Contributor& c = m.contributors[i];
    DL_RETURN_IF_ERROR(CheckIdentifier(c.learner, kMaxNameBytes, false, who, "contributor " + Str(i) + " learner"));
    DL_RETURN_IF_ERROR(CheckFiniteNonNegative(c.weight, who, "contributor " + Str(i) + " weight"));
  }
  return CheckPayloadInfo(m.payload, o, who, payload_bytes);
}

Status Check(const SnapshotRequestMsg& m, const ParseOptions& o, std::string_view who, uint64_t*) {
  DL_RETURN_IF_ERROR(CheckText(m.reason, kMaxTextBytes, who, "reason"));
  return CheckFragmentSet(m.fragments, o, who, "fragments");
}

Status Check(const SnapshotMsg& m, const ParseOptions& o, std::string_view who, uint64_t* payload_bytes) {
  if (m.num_parts == 0 || m.num_parts > o.max_fragments) {
    return Status::Error(std::string(who) + ": " + Str(m.num_parts) + " parts (valid: 1.." +
                         Str(o.max_fragments) + ")");
  }
  if (m.part >= m.num_parts) {
    return Status::Error(std::string(who) + ": part " + Str(m.part) + " of " + Str(m.num_parts));
  }
  if (m.versions.empty()) return Status::Error(std::string(who) + ": no fragment versions");
  if (m.fragment >= m.versions.size()) {
    return Status::Error(std::string(who) + ": fragment " + Str(m.fragment) + " but versions for " +
                         Str(m.versions.size()) + " fragments");
  }
  if (m.version != m.versions[m.fragment]) {
    return Status::Error(std::string(who) + ": fragment " + Str(m.fragment) + " at version " +
                         Str(m.version) + " but the cut says " + Str(m.versions[m.fragment]));
  }
  if (m.payload.codec != CodecKind::kFp32 || m.payload.topk_fraction != 0) {
    return Status::Error(std::string(who) + ": snapshot payload must be dense fp32, is " +
                         std::string(CodecName(m.payload.codec)) +
                         (m.payload.topk_fraction != 0 ? " top-k" : ""));
  }
  return CheckPayloadInfo(m.payload, o, who, payload_bytes);
}

Status Check(const JobSpecMsg& m, const ParseOptions&, std::string_view who, uint64_t*) {
  if (m.config_yaml.empty()) return Status::Error(std::string(who) + ": empty config");
  return Status::Ok();
}

Status Check(const ControlMsg& m, const ParseOptions&, std::string_view who, uint64_t*) {
  DL_RETURN_IF_ERROR(CheckIdentifier(m.name, kMaxNameBytes, false, who, "name"));
  for (size_t i = 0; i < m.args.size(); ++i) {
    DL_RETURN_IF_ERROR(CheckIdentifier(m.args[i].key, kMaxNameBytes, false, who, "arg " + Str(i) + " key"));
    DL_RETURN_IF_ERROR(CheckText(m.args[i].value, kMaxTextBytes, who, "arg " + Str(i) + " value"));
  }
  return Status::Ok();
}

Status Check(const SyncerStatusMsg& m, const ParseOptions& o, std::string_view who, uint64_t*) {
  for (size_t i = 0; i < m.live_learners.size(); ++i) {
    DL_RETURN_IF_ERROR(CheckIdentifier(m.live_learners[i], kMaxNameBytes, false, who, "live learner " + Str(i)));
  }
  if (!m.live_steps.empty() && m.live_steps.size() != m.live_learners.size()) {
    return Status::Error(std::string(who) + ": " + Str(m.live_steps.size()) + " live steps for " +
                         Str(m.live_learners.size()) + " live learners");
  }
  for (size_t i = 0; i < m.recent_drops.size(); ++i) {
    const DroppedDelta& d = m.recent_drops[i];
    DL_RETURN_IF_ERROR(CheckIdentifier(d.learner, kMaxNameBytes, false, who, "drop " + Str(i) + " learner"));
    DL_RETURN_IF_ERROR(CheckFragment(d.fragment, o, who, "drop " + Str(i) + " fragment"));
    DL_RETURN_IF_ERROR(CheckText(d.reason, kMaxTextBytes, who, "drop " + Str(i) + " reason"));
  }
  for (size_t i = 0; i < m.acks.size(); ++i) {
    const LearnerAck& a = m.acks[i];
    const std::string what = "ack " + Str(i);
    DL_RETURN_IF_ERROR(CheckIdentifier(a.learner, kMaxNameBytes, false, who, what + " learner"));
    if (a.pending_bases.size() != a.pending_fragments.size()) {
      return Status::Error(std::string(who) + ": " + what + " has " + Str(a.pending_fragments.size()) +
                           " pending fragments but " + Str(a.pending_bases.size()) + " bases");
    }
    for (size_t j = 0; j < a.pending_fragments.size(); ++j) {
      DL_RETURN_IF_ERROR(CheckFragment(a.pending_fragments[j], o, who, what + " pending " + Str(j)));
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckBody(const MessageBody& body, const ParseOptions& o, std::string_view who,
                 uint64_t* payload_bytes) {
  *payload_bytes = 0;
  // A message added to the schema without a Check above does not compile.
  return std::visit([&](const auto& m) { return Check(m, o, who, payload_bytes); }, body);
}

}  // namespace diloco::wire_io
