#include "daemon/net/chunk_frame.h"

#include <cstring>

#include "daemon/net/wire_constants.h"
#include "daemon/util/crc32c.h"

namespace diloco::net {
namespace {

constexpr char kMagic[4] = {'D', 'L', 'C', 'K'};

template <class T>
void Put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}

template <class T>
T Get(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{p[i]} << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

std::vector<uint8_t> EncodeChunkFrame(const ChunkFrame& f) {
  std::vector<uint8_t> out(kChunkFrameFixedBytes + f.sender.size() + 4);
  uint8_t* p = out.data();
  std::memcpy(p, kMagic, 4);
  p[4] = kChunkFrameVersion;
  p[5] = static_cast<uint8_t>(f.kind);
  Put<uint16_t>(p + 6, static_cast<uint16_t>(f.sender.size()));
  Put<uint64_t>(p + 8, f.incarnation);
  Put<uint64_t>(p + 16, f.seq);
  Put<uint32_t>(p + 24, f.index);
  Put<uint32_t>(p + 28, f.count);
  Put<uint64_t>(p + 32, f.payload_bytes);
  Put<uint32_t>(p + 40, f.crc32c);
  std::memcpy(p + kChunkFrameFixedBytes, f.sender.data(), f.sender.size());
  const size_t body = kChunkFrameFixedBytes + f.sender.size();
  Put<uint32_t>(p + body, Crc32c(p, body));
  return out;
}

bool LooksLikeChunkFrame(std::span<const uint8_t> frame) {
  return frame.size() >= 4 && std::memcmp(frame.data(), kMagic, 4) == 0;
}

Status DecodeChunkFrame(std::span<const uint8_t> frame, ChunkFrame* out) {
  const std::string what = "chunk frame of " + std::to_string(frame.size()) + " bytes";
  if (frame.size() < kChunkFrameFixedBytes + 4 || !LooksLikeChunkFrame(frame)) {
    return Status::Error(what + ": too short or no \"DLCK\" magic: not a dilocod chunk frame");
  }
  const uint8_t* p = frame.data();
  const size_t sender_bytes = Get<uint16_t>(p + 6);
  if (sender_bytes > kMaxNameBytes || frame.size() != kChunkFrameFixedBytes + sender_bytes + 4) {
    return Status::Error(what + ": declares a sender of " + std::to_string(sender_bytes) +
                         " bytes, which does not fit the frame (or exceeds " + std::to_string(kMaxNameBytes) + ")");
  }
  const size_t body = kChunkFrameFixedBytes + sender_bytes;
  if (Crc32c(p, body) != Get<uint32_t>(p + body)) {
    return Status::Error(what + ": CRC32C mismatch: corrupted in transit");
  }
  if (p[4] != kChunkFrameVersion) {
    return Status::Error(what + ": version " + std::to_string(p[4]) + " is not " +
                         std::to_string(kChunkFrameVersion) + " (a newer sender?)");
  }
  if (p[5] != static_cast<uint8_t>(ChunkKind::kChunk) && p[5] != static_cast<uint8_t>(ChunkKind::kSeal)) {
    return Status::Error(what + ": unknown kind " + std::to_string(p[5]));
  }
  out->kind = static_cast<ChunkKind>(p[5]);
  out->sender.assign(reinterpret_cast<const char*>(p + kChunkFrameFixedBytes), sender_bytes);
  out->incarnation = Get<uint64_t>(p + 8);
  out->seq = Get<uint64_t>(p + 16);
  out->index = Get<uint32_t>(p + 24);
  out->count = Get<uint32_t>(p + 28);
  out->payload_bytes = Get<uint64_t>(p + 32);
  out->crc32c = Get<uint32_t>(p + 40);
  return Status::Ok();
}

}  // namespace diloco::net
