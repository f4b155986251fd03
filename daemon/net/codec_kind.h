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
// topk_chunked (codec.h) is not dense: its size depends on its keep and bits too, so
// EncodedBytes gives 0 for it; TopkChunkedBytes (below) gives its exact size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace diloco {

enum class CodecKind : uint8_t { kFp32 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4, kTopkChunked = 5 };

inline constexpr int kDefaultCodecBlock = 64;

// Sender-side error feedback (codec.h ErrorFeedback): what the codec lost is carried to the next
// message as a plain residual (e <- e + delta), or in an accumulator that decays
// (e <- decay * e + delta; SparseLoCo's, which replaces outer momentum). Config spellings:
// kFeedbackNames (sync_config.h).
enum class FeedbackRule : uint8_t { kResidual = 0, kAccumulate = 1 };

// True for the five values above (wire bytes are checked with this before any cast).
constexpr bool IsValidCodecKind(uint8_t v) { return v >= 1 && v <= 5; }

// True for the dense codecs (fp32, bf16, int8, int4): every value is sent, EncodedBytes is exact.
constexpr bool IsDenseCodecKind(CodecKind kind) {
  return static_cast<uint8_t>(kind) >= 1 && static_cast<uint8_t>(kind) <= 4;
}

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
    case CodecKind::kTopkChunked:
      return 0;  // not dense: TopkChunkedBytes below
  }
  return 0;
}

// topk_chunked (codec.h; records in kernels/sync_sparse.h): the exact bytes of numel values of one
// tensor cut into chunks of `chunk` values, keeping `keep` of each full chunk and
// min(len, max(1, ceil(keep * len / chunk))) of a short last one of len values:
//   8-byte header + per chunk (4 + ceil(kc * ib / 8) + ceil(kc * bits / 8)), ib = bit_width(chunk - 1)
// 0 for chunk or keep < 1. No overflow for numel < 2^48.
constexpr size_t TopkChunkedBytes(size_t numel, int chunk, int keep, int value_bits) {
  if (chunk < 1 || keep < 1 || value_bits < 1) return 0;
  const size_t C = static_cast<size_t>(chunk), K = static_cast<size_t>(keep), b = static_cast<size_t>(value_bits);
  size_t ib = 1;
  while (ib < 64 && (size_t{1} << ib) < C) ++ib;
  auto keep_of = [&](size_t len) {
    const size_t k = (K * len + C - 1) / C;
    return k < 1 ? size_t{1} : (k > len ? len : k);
  };
  auto record = [&](size_t kc) { return 4 + (kc * ib + 7) / 8 + (kc * b + 7) / 8; };
  size_t bytes = 8 + numel / C * record(keep_of(C));
  if (numel % C != 0) bytes += record(keep_of(numel % C));
  return bytes;
}

// "fp32", "bf16", "int8", "int4", "topk_chunked"; "invalid" otherwise.
constexpr std::string_view CodecName(CodecKind kind) {
  switch (kind) {
    case CodecKind::kFp32: return "fp32";
    case CodecKind::kBf16: return "bf16";
    case CodecKind::kInt8: return "int8";
    case CodecKind::kInt4: return "int4";
    case CodecKind::kTopkChunked: return "topk_chunked";
  }
  return "invalid";
}

// Parses a name written by CodecName (as in run configs: sync.codec.up: int4).
constexpr bool ParseCodecKind(std::string_view name, CodecKind* out) {
  for (uint8_t v = 1; IsValidCodecKind(v); ++v) {
    if (CodecName(static_cast<CodecKind>(v)) == name) {
      *out = static_cast<CodecKind>(v);
      return true;
    }
  }
  return false;
}

}  // namespace diloco
