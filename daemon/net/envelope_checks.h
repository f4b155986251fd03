// Internal to the envelope code (envelope.cpp, message_checks.cpp and the read/write code
// generated from proto/dilocod.fbs): the field checks every message is built from, and the
// semantic check of each message (message_checks.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/net/envelope.h"
#include "daemon/util/status.h"

namespace diloco::wire_io {

// codec.h's top-k payload header size (kTopkHeaderBytes there): the wire only bounds top-k
// tensor sizes, the codec checks them exactly.
inline constexpr uint64_t kTopkHeaderBytes = 16;
inline constexpr int kMinBlock = 2;
inline constexpr int kMaxBlock = 65536;

inline std::string Str(uint64_t v) { return std::to_string(v); }
inline uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// A name fit for an error message even when it is not a valid identifier.
std::string Printable(std::string_view s, size_t max = 64);
// "delta from learner-2"
std::string MessageWho(MessageType type, std::string_view sender);

// Each returns an error "<who>: <field> ..." naming what is wrong.
// Identifiers: printable ASCII without spaces (they end up in logs and file names).
Status CheckIdentifier(std::string_view s, size_t max_bytes, bool may_be_empty, std::string_view who,
                       std::string_view field);
Status CheckText(std::string_view s, size_t max_bytes, std::string_view who, std::string_view field);
Status CheckListSize(size_t n, size_t max, std::string_view who, std::string_view field);
Status CheckFragment(uint64_t fragment, const ParseOptions& o, std::string_view who,
                     std::string_view field = "fragment");
// Fragment indices in a list: each < max_fragments, no repeats.
Status CheckFragmentSet(std::vector<uint32_t> fragments, const ParseOptions& o, std::string_view who,
                        std::string_view field);
Status CheckFiniteNonNegative(float v, std::string_view who, std::string_view field);

// The envelope's header fields against the options (version, job, sender allowlist).
Status CheckHeader(const EnvelopeHeader& h, const ParseOptions& o, std::string_view who);
// The semantics of a body (message_checks.cpp, one function per message); *payload_bytes = the
// bytes its payload must have (0 without one). List sizes are checked before, by the generated
// Read (parse) or CheckLists (build).
Status CheckBody(const MessageBody& body, const ParseOptions& o, std::string_view who,
                 uint64_t* payload_bytes);

}  // namespace diloco::wire_io
