#include "daemon/net/wire_transport.h"

namespace diloco::net {

Message ToMessage(OutgoingMessage&& out, std::shared_ptr<const void> payload_owner) {
  Message m;
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

}  // namespace diloco::net
