// Glue between the wire (envelope.h) and the transport (channel.h): outgoing messages become
// zero-copy ZeroMQ frames, and ParseEnvelope becomes a channel's validator.
//
//   auto parsed = std::make_shared<ParsedMessage>();
//   ReceiveOptions ro;
//   ro.validator = EnvelopeValidator(expect, parsed);
//   SubChannel::Create(ctx, options, ro, &uplink);
//   ...
//   if (uplink->Receive(&r, timeout) == RecvResult::kMessage) Use(*parsed);  // r's parse
#pragma once

#include <memory>

#include "daemon/net/channel.h"
#include "daemon/net/envelope.h"

namespace diloco::net {

// Payloads of at least this many chunks are published in the chunked form (chunk_frame.h): one
// ZeroMQ message per chunk, so that sending, receiving and checking overlap. Smaller ones gain
// nothing from it and stay one multipart message.
inline constexpr size_t kMinChunkedFrames = 2;

// The frames of an outgoing wire message: the header moves in (no copy), the payload chunks are
// sent without copying and keep payload_owner alive until ZeroMQ has sent them (the chunks must
// point into memory payload_owner keeps alive and unchanged). With kMinChunkedFrames chunks or
// more (from BuildMessage) the message carries their chunk_info(): PubChannel sends it chunked.
Message ToMessage(OutgoingMessage&& out, std::shared_ptr<const void> payload_owner);

// A validator that runs ParseEnvelope(frames, expect) into *parsed and reports the envelope's
// (sender, incarnation, seq). After a channel's Receive returns kMessage, *parsed is that
// message's parse, until the next Receive. The channel's thread owns *parsed.
Validator EnvelopeValidator(ParseOptions expect, std::shared_ptr<ParsedMessage> parsed);

// The same with ParseEnvelopeInPlace: the payload is not copied out of the received frames.
// parsed->payload_chunks share the frames' buffers (ZeroMQ reference counts them), so they stay
// valid until *parsed is overwritten or MakeContiguous() is called, also after the Received is
// gone; parsed->payload stays empty (decode from payload_spans(), or MakeContiguous()).
Validator EnvelopeValidatorInPlace(ParseOptions expect, std::shared_ptr<ParsedMessage> parsed);

}  // namespace diloco::net
