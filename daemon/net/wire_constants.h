// Constants of the wire format (envelope.h documents the framing). Their own header because the
// message structs generated from proto/dilocod.fbs use kProtocolVersion as a default.
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace diloco
