// The chunked form of a wire message (envelope.h): instead of one ZeroMQ multipart message
// [header][chunk 0]...[chunk n-1], a PUB sends n + 1 ZeroMQ messages on the same connection:
//   [chunk frame: kind chunk, index k][chunk k]      for k = 0 .. n-1
//   [chunk frame: kind seal, index n][header]        last: the envelope's frame 0, unchanged
// so the sender's I/O thread starts sending chunk 0 while the rest is queued, and the receiver
// checks chunk k (its own CRC32C) while chunk k+1 is still on the wire; the seal's envelope is
// then verified as before (ParseEnvelopeInPlace) with the chunk CRCs combined, not recomputed.
// The schema (proto/dilocod.fbs) is untouched: the chunk frame is transport framing, like a
// SUB topic, and a receiver accepts both forms (chunk_assembler.h puts the pieces back).
//
// Chunk frame, little-endian, kChunkFrameFixedBytes + sender bytes + 4:
//   0  "DLCK"        magic
//   4  u8 version    kChunkFrameVersion
//   5  u8 kind       1 chunk, 2 seal
//   6  u16 sender    length of the sender name that follows the fixed part
//   8  u64 incarnation, 16 u64 seq   the envelope's (sender, incarnation, seq)
//   24 u32 index     chunk: 0 .. count-1; seal: count
//   28 u32 count     payload chunks of the message
//   32 u64 payload_bytes
//   40 u32 crc32c    chunk: CRC32C of the chunk's bytes; seal: 0
//   44 sender bytes, then u32 CRC32C of everything before it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "daemon/util/status.h"

namespace diloco::net {

inline constexpr size_t kChunkFrameFixedBytes = 44;
inline constexpr uint8_t kChunkFrameVersion = 1;

enum class ChunkKind : uint8_t { kChunk = 1, kSeal = 2 };

struct ChunkFrame {
  ChunkKind kind = ChunkKind::kChunk;
  std::string sender;
  uint64_t incarnation = 0;
  uint64_t seq = 0;
  uint32_t index = 0;
  uint32_t count = 0;
  uint64_t payload_bytes = 0;
  uint32_t crc32c = 0;
};

// What a Message knows of its payload frames (frames 1..n): the sender's identity, set by
// ToMessage so that PubChannel can send the frames in the chunked form, and one CRC32C per
// payload frame (sender: from BuildMessage; receiver: computed by the assembler as they came).
struct ChunkInfo {
  std::string sender;
  uint64_t incarnation = 0;
  uint64_t seq = 0;
  uint64_t payload_bytes = 0;
  std::vector<uint32_t> crc32c;
  // Sender only: frame 0 lacks the payload CRC32C (BuildOptions::defer_payload_crc) and crc32c is
  // empty until seal(frame 0, payload CRC) writes it. PubChannel computes the chunk CRCs while it
  // sends the chunks; any other use of the frames completes the message first (Message::Complete).
  bool crc_pending = false;
  std::function<void(std::span<uint8_t> frame0, uint32_t payload_crc32c)> seal;
};

std::vector<uint8_t> EncodeChunkFrame(const ChunkFrame& f);
// True when frame starts with the magic: it is meant as a chunk frame (DecodeChunkFrame decides
// whether it is a good one).
bool LooksLikeChunkFrame(std::span<const uint8_t> frame);
// Checks size, magic, version, kind, the frame's CRC32C and the sender's length.
Status DecodeChunkFrame(std::span<const uint8_t> frame, ChunkFrame* out);

}  // namespace diloco::net
