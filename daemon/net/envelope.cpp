// Wire format: BuildMessage / ParseEnvelope and the ParsedMessage accessors. See envelope.h for
// the framing and the order of checks. The field-by-field read and write code is generated from
// proto/dilocod.fbs (proto/dilocod_messages_io.h); each message's checks are in
// message_checks.cpp, the payload frames' in envelope_chunks.cpp.
#include "daemon/net/envelope.h"

#include <flatbuffers/flatbuffers.h>

#include <algorithm>
#include <cstring>

#include "daemon/net/envelope_checks.h"
#include "daemon/util/crc32c.h"
#include "proto/dilocod_generated.h"
#include "proto/dilocod_messages_io.h"

namespace diloco {
namespace {

namespace fb = flatbuffers;
namespace w = diloco::wire;
using wire_io::CeilDiv;
using wire_io::PayloadFrame;
using wire_io::Printable;
using wire_io::Str;

// FlatBuffer minimum: root offset + file identifier.
constexpr size_t kMinFlatBufferBytes = 8;

static_assert(std::variant_size_v<MessageBody> == kNumMessageTypes);

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
  auto body_offset = wire_io::WriteBody(b, body, f);
  w::FinishEnvelopeBuffer(b, wire_io::Write(b, h, f, static_cast<w::Body>(body_type), body_offset));
  out->header.assign(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  AppendCrcTrailer(&out->header);
  out->chunks.clear();
  out->chunk_crc32c.clear();
  out->crc_pending = false;
  out->crc_offset = 0;
  for (size_t pos = 0; pos < payload.size(); pos += chunk_bytes) {
    out->chunks.push_back(payload.subspan(pos, std::min(chunk_bytes, payload.size() - pos)));
  }
}

// CRC32C of a payload, one chunk at a time from the last: a payload just written by an encoder
// (or just sent) has its end in cache, which a forward pass would evict before reaching it.
// Each chunk's CRC goes to *chunk_crcs (in chunk order).
uint32_t PayloadCrc32c(std::span<const uint8_t> payload, std::vector<uint32_t>* chunk_crcs) {
  chunk_crcs->assign(CeilDiv(payload.size(), kChunkBytes), 0);
  uint32_t crc = 0;
  uint64_t tail = 0;
  for (size_t end = payload.size(); end > 0;) {
    const size_t begin = (end - 1) / kChunkBytes * kChunkBytes;
    const uint32_t c = Crc32c(payload.data() + begin, end - begin);
    (*chunk_crcs)[begin / kChunkBytes] = c;
    crc = Crc32cCombine(c, crc, tail);
    tail += end - begin;
    end = begin;
  }
  return crc;
}

constexpr uint32_t kCrcStandIn = 0xFFFFFFFFu;

// Where the Payload table's payload_crc32c lies in a header just written (Delta or Global).
size_t PayloadCrcOffset(const std::vector<uint8_t>& header, MessageType type) {
  const w::Envelope* env = w::GetEnvelope(header.data());
  const w::Payload* p = type == MessageType::kDelta ? env->body_as_Delta()->payload()
                                                     : env->body_as_Global()->payload();
  const uint8_t* at = reinterpret_cast<const fb::Table*>(p)->GetAddressOf(w::Payload::VT_PAYLOAD_CRC32C);
  return at == nullptr ? 0 : static_cast<size_t>(at - header.data());
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
                    std::span<const uint8_t> payload, OutgoingMessage* out, BuildOptions options) {
  const MessageType type = TypeOf(body);
  const std::string who = "building " + wire_io::MessageWho(type, header.sender);
  ParseOptions o;
  o.min_protocol_version = o.max_protocol_version = header.protocol_version;
  o.any_job = true;
  o.model_params = kMaxModelParams;
  DL_RETURN_IF_ERROR(wire_io::CheckHeader(header, o, who));
  uint64_t payload_bytes = 0;
  DL_RETURN_IF_ERROR(std::visit([&](const auto& m) { return wire_io::CheckLists(m, o, who); }, body));
  DL_RETURN_IF_ERROR(wire_io::CheckBody(body, o, who, &payload_bytes));
  if (payload.size() != payload_bytes) {
    return Status::Error(who + ": the tensors' encoded bytes sum to " + Str(payload_bytes) +
                         " but the payload has " + Str(payload.size()));
  }
  PayloadFrame f;
  f.payload_bytes = payload.size();
  std::vector<uint32_t> chunk_crcs;
  bool defer = options.defer_payload_crc && !payload.empty() &&
               (type == MessageType::kDelta || type == MessageType::kGlobal);
  // Deferred: a non-zero stand-in, so the field is written (a zero would be left out as the
  // default) and SealPayloadCrc32c finds its place.
  f.payload_crc32c = defer ? kCrcStandIn : PayloadCrc32c(payload, &chunk_crcs);
  f.num_chunks = static_cast<uint32_t>(CeilDiv(payload.size(), kChunkBytes));
  if (const auto* s = std::get_if<SnapshotMsg>(&body); s && s->fragment_crc32c != f.payload_crc32c) {
    return Status::Error(who + ": fragment CRC32C " + Str(s->fragment_crc32c) +
                         " is not the CRC32C of its fp32 values (" + Str(f.payload_crc32c) + ")");
  }
  WriteMessage(header, body, static_cast<uint8_t>(type), payload, f, kChunkBytes, out);
  out->crc_offset = defer ? PayloadCrcOffset(out->header, type) : 0;
  if (defer && out->crc_offset == 0) {  // not expected: then not deferred after all
    defer = false;
    f.payload_crc32c = PayloadCrc32c(payload, &chunk_crcs);
    WriteMessage(header, body, static_cast<uint8_t>(type), payload, f, kChunkBytes, out);
  }
  out->chunk_crc32c = std::move(chunk_crcs);
  out->crc_pending = defer;
  out->sender = header.sender;
  out->incarnation = header.incarnation;
  out->seq = header.seq;
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
  f.payload_bytes = raw.payload_bytes.value_or(payload.size());
  f.payload_crc32c = raw.payload_crc32c.value_or(payload.empty() ? 0 : Crc32c(payload.data(), payload.size()));
  f.num_chunks = raw.num_chunks.value_or(static_cast<uint32_t>(CeilDiv(payload.size(), kChunkBytes)));
  const uint8_t type = raw.body_type.value_or(static_cast<uint8_t>(TypeOf(body)));
  WriteMessage(header, body, type, payload, f, raw.chunk_bytes == 0 ? kChunkBytes : raw.chunk_bytes,
               out);
}

void SealPayloadCrc32c(std::span<uint8_t> header, size_t crc_offset, uint32_t crc) {
  for (int i = 0; i < 4; ++i) header[crc_offset + i] = static_cast<uint8_t>(crc >> (8 * i));
  const size_t fb_size = header.size() - kHeaderCrcBytes;
  const uint32_t trailer = Crc32c(header.data(), fb_size);
  for (int i = 0; i < 4; ++i) header[fb_size + i] = static_cast<uint8_t>(trailer >> (8 * i));
}

void ResealHeader(std::vector<uint8_t>* frame0) {
  if (frame0->size() < kHeaderCrcBytes) return;
  frame0->resize(frame0->size() - kHeaderCrcBytes);
  AppendCrcTrailer(frame0);
}


namespace {

// ParseEnvelope (copies the payload) and ParseEnvelopeInPlace (in_place: keeps it in the frames).
Status Parse(std::span<const std::span<const uint8_t>> frames, const ParseOptions& o, bool in_place,
             std::shared_ptr<const void> owner, std::span<const uint32_t> chunk_crcs, ParsedMessage* out) {
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
  const std::string sender = wire_io::ReadString(env->sender());
  const auto raw_type = static_cast<uint8_t>(env->body_type());
  if (raw_type == 0 || raw_type > kNumMessageTypes) {
    return Status::Error("envelope from " + Printable(sender) + ": body type " + Str(raw_type) +
                         (raw_type == 0 ? " (none)" : " is unknown (a newer protocol?)"));
  }
  const auto type = static_cast<MessageType>(raw_type);
  const std::string who = wire_io::MessageWho(type, sender);
  if (env->body() == nullptr) return Status::Error(who + ": body is missing");
  PayloadFrame f;
  DL_RETURN_IF_ERROR(wire_io::Read(env, o, who, &out->header, &f));
  DL_RETURN_IF_ERROR(wire_io::CheckHeader(out->header, o, who));
  if ((o.accept & MessageBit(type)) == 0) {
    return Status::Error(who + ": this socket does not accept " +
                         std::string(MessageTypeName(type)) + " messages");
  }
  // 4. Body: copy out (lists bounded), then semantics.
  DL_RETURN_IF_ERROR(wire_io::ReadBody(env, type, o, who, &out->body, &f));
  uint64_t payload_bytes = 0;
  DL_RETURN_IF_ERROR(wire_io::CheckBody(out->body, o, who, &payload_bytes));
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
    if (f.payload_bytes != payload_bytes) {
      return Status::Error(who + ": declares " + Str(f.payload_bytes) +
                           " payload bytes but its tensors' encoded bytes sum to " +
                           Str(payload_bytes));
    }
    if (f.num_chunks != chunks.size()) {
      return Status::Error(who + ": declares " + Str(f.num_chunks) + " payload frames, got " +
                           Str(chunks.size()));
    }
    // 5. Chunks and CRC.
    if (in_place) {
      out->payload.clear();
      DL_RETURN_IF_ERROR(VerifyChunks(chunks, f.payload_bytes, f.payload_crc32c, who, chunk_crcs));
      out->payload_chunks.assign(chunks.begin(), chunks.end());
      out->payload_owner = std::move(owner);
    } else {
      DL_RETURN_IF_ERROR(ReassembleChunks(chunks, f.payload_bytes, f.payload_crc32c, who, &out->payload));
    }
    out->payload_crc32c = f.payload_crc32c;
    if (const auto* s = std::get_if<SnapshotMsg>(&out->body); s && s->fragment_crc32c != f.payload_crc32c) {
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
  return Parse(frames, o, false, nullptr, {}, out);
}

Status ParseEnvelopeInPlace(std::span<const std::span<const uint8_t>> frames, const ParseOptions& o,
                            std::shared_ptr<const void> frames_owner, ParsedMessage* out,
                            std::span<const uint32_t> chunk_crc32c) {
  return Parse(frames, o, true, std::move(frames_owner), chunk_crc32c, out);
}

}  // namespace diloco
