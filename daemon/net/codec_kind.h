// The tensor codecs' identities and wire sizes: THE shared definition.
//
// The wire (envelope.h: descriptor checks in ParseEnvelope) and the codecs (codec.h: Encode and
// Decode) both size payloads with EncodedBytes below, so a sender and a receiver can never
// disagree on how many bytes n encoded values take. Change a size here and both follow; the
// numeric CodecKind values are also the values of the `Codec` enum on the wire
// (proto/dilocod.fbs), so they are append-only: never renumber, 0 stays invalid.
//
// | codec | bytes for n values, block size B (one fp32 scale per block, blocks never span tensors) |
// | ----- | -------------------------------------------------------------------------------------- |
// | fp32  | 4 n                                                                                    |
// | bf16  | 2 n                                                                                    |
// | int8  | n + 4 ceil(n / B)                                                                      |
// | int4  | ceil(n / 2) + 4 ceil(n / B)                                                            |
// Top-k payloads (codec.h) are a header, an index encoding and then EncodedBytes(kind, k, B).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace diloco {

enum class CodecKind : uint8_t { kFp32 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4 };

inline constexpr int kDefaultCodecBlock = 64;

// True for the four values above (wire bytes are checked with this before any cast).
constexpr bool IsValidCodecKind(uint8_t v) { return v >= 1 && v <= 4; }

// True for the codecs that carry one fp32 scale per block (int8, int4).
constexpr bool CodecUsesBlocks(CodecKind kind) {
  return kind == CodecKind::kInt8 || kind == CodecKind::kInt4;
}

// Encoded size in bytes of numel values of one tensor (table above). block_size only matters
// for int8/int4, where it must be >= 1 (a block size < 1 gives 0: never a valid size for
// numel > 0). No overflow for numel < 2^61.
constexpr size_t EncodedBytes(CodecKind kind, size_t numel, int block_size) {
  switch (kind) {
    case CodecKind::kFp32:
      return 4 * numel;
    case CodecKind::kBf16:
      return 2 * numel;
    case CodecKind::kInt8:
    case CodecKind::kInt4: {
      if (block_size < 1) return 0;
      const size_t b = static_cast<size_t>(block_size);
      const size_t scales = 4 * ((numel + b - 1) / b);
      return scales + (kind == CodecKind::kInt8 ? numel : (numel + 1) / 2);
    }
  }
  return 0;
}

// "fp32", "bf16", "int8", "int4"; "invalid" otherwise.
constexpr std::string_view CodecName(CodecKind kind) {
  switch (kind) {
    case CodecKind::kFp32: return "fp32";
    case CodecKind::kBf16: return "bf16";
    case CodecKind::kInt8: return "int8";
    case CodecKind::kInt4: return "int4";
  }
  return "invalid";
}

// Parses a name written by CodecName (as in run configs: sync.codec.up: int4).
constexpr bool ParseCodecKind(std::string_view name, CodecKind* out) {
  for (uint8_t v = 1; v <= 4; ++v) {
    if (CodecName(static_cast<CodecKind>(v)) == name) {
      *out = static_cast<CodecKind>(v);
      return true;
    }
  }
  return false;
}

}  // namespace diloco
