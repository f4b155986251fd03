#include "daemon/net/wire_transport.h"

#include "daemon/util/crc32c.h"

namespace diloco::net {

Message ToMessage(OutgoingMessage&& out, std::shared_ptr<const void> payload_owner) {
  Message m;
  const bool chunked = out.chunks.size() >= kMinChunkedFrames;
  if (out.crc_pending && !chunked) {
    // Sent whole: nothing to overlap the CRC with.
    Crc32cJoiner joined;
    for (const auto& c : out.chunks) joined.Add(Crc32c(c.data(), c.size()), c.size());
    SealPayloadCrc32c(out.header, out.crc_offset, joined.crc());
    out.crc_pending = false;
  }
  if (chunked && (out.crc_pending || out.chunk_crc32c.size() == out.chunks.size())) {
    auto info = std::make_shared<ChunkInfo>();
    info->sender = std::move(out.sender);
    info->incarnation = out.incarnation;
    info->seq = out.seq;
    for (const auto& c : out.chunks) info->payload_bytes += c.size();
    info->crc32c = std::move(out.chunk_crc32c);
    if (out.crc_pending) {
      info->crc_pending = true;
      info->seal = [offset = out.crc_offset](std::span<uint8_t> frame0, uint32_t crc) {
        SealPayloadCrc32c(frame0, offset, crc);
      };
    }
    m.set_chunk_info(std::move(info));
  }
  m.AddOwned(std::move(out.header));
  for (const auto& c : out.chunks) m.AddShared(payload_owner, c.data(), c.size());
  return m;
}

Validator EnvelopeValidator(ParseOptions expect, std::shared_ptr<ParsedMessage> parsed) {
  return [expect = std::move(expect), parsed = std::move(parsed)](const Message& m, MessageMeta* meta) -> Status {
    const std::vector<std::span<const uint8_t>> frames = m.spans();
    DL_RETURN_IF_ERROR(ParseEnvelope(frames, expect, parsed.get()));
    meta->sender = parsed->header.sender;
    meta->epoch = parsed->header.incarnation;
    meta->seq = parsed->header.seq;
    meta->sequenced = true;
    return Status::Ok();
  };
}

Validator EnvelopeValidatorInPlace(ParseOptions expect, std::shared_ptr<ParsedMessage> parsed) {
  return [expect = std::move(expect), parsed = std::move(parsed)](const Message& m, MessageMeta* meta) -> Status {
    const std::vector<std::span<const uint8_t>> frames = m.spans();
    // The payload frames' buffers, shared (zmq_msg_copy counts references, it copies only
    // frames small enough to live inside the message object); frame 0 is read during the call.
    std::shared_ptr<std::vector<zmq::message_t>> owner;
    std::vector<std::span<const uint8_t>> spans;
    if (frames.size() > 1) {
      owner = std::make_shared<std::vector<zmq::message_t>>(frames.size() - 1);
      spans.reserve(frames.size());
      spans.push_back(frames[0]);
      for (size_t i = 1; i < frames.size(); ++i) {
        zmq::message_t& share = (*owner)[i - 1];
        share.copy(const_cast<zmq::message_t&>(m.frames()[i]));  // m is not modified
        spans.emplace_back(static_cast<const uint8_t*>(share.data()), share.size());
      }
    } else {
      spans = frames;
    }
    // Chunks received in the chunked form were CRC-checked on arrival: combine those CRCs.
    std::span<const uint32_t> crcs;
    if (const auto& info = m.chunk_info(); info && info->crc32c.size() + 1 == frames.size()) crcs = info->crc32c;
    DL_RETURN_IF_ERROR(ParseEnvelopeInPlace(spans, expect, std::move(owner), parsed.get(), crcs));
    meta->sender = parsed->header.sender;
    meta->epoch = parsed->header.incarnation;
    meta->seq = parsed->header.seq;
    meta->sequenced = true;
    return Status::Ok();
  };
}

}  // namespace diloco::net
