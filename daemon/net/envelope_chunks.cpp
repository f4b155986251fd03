// The payload frames: chunk counts and sizes, the CRC32C over the chunks in place
// (VerifyChunks) or while copying them into one buffer (ReassembleChunks).
#include <string>

#include "daemon/net/envelope_checks.h"
#include "daemon/util/crc32c.h"

namespace diloco {
namespace {

using wire_io::CeilDiv;
using wire_io::Str;

Status CheckChunkSizes(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                       std::string_view what) {
  const uint64_t want = CeilDiv(payload_bytes, kChunkBytes);
  if (chunks.size() != want) {
    return Status::Error(std::string(what) + ": " + Str(chunks.size()) + " payload frames for " +
                         Str(payload_bytes) + " bytes (want " + Str(want) + " of at most 4 MiB)");
  }
  // Sizes first: nothing is allocated for a payload whose frames do not add up.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const uint64_t expect = i + 1 < chunks.size() ? kChunkBytes : payload_bytes - i * kChunkBytes;
    if (chunks[i].size() != expect) {
      return Status::Error(std::string(what) + ": payload frame " + Str(i + 1) + " of " +
                           Str(chunks.size()) + " has " + Str(chunks[i].size()) +
                           " bytes, want " + Str(expect));
    }
  }
  return Status::Ok();
}

Status CrcMismatch(std::string_view what, uint64_t payload_bytes, uint32_t declared, uint32_t computed) {
  return Status::Error(std::string(what) + ": payload CRC32C mismatch (declared " + Str(declared) +
                       ", computed " + Str(computed) + " over " + Str(payload_bytes) +
                       " bytes): corrupted in transit, drop it");
}


}  // namespace

Status VerifyChunks(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                    uint32_t payload_crc32c, std::string_view what, std::span<const uint32_t> chunk_crc32c) {
  DL_RETURN_IF_ERROR(CheckChunkSizes(chunks, payload_bytes, what));
  if (!chunk_crc32c.empty()) {
    if (chunk_crc32c.size() != chunks.size()) {
      return Status::Error(std::string(what) + ": " + Str(chunk_crc32c.size()) + " chunk CRCs for " +
                           Str(chunks.size()) + " payload frames");
    }
    Crc32cJoiner joined;
    for (size_t i = 0; i < chunks.size(); ++i) joined.Add(chunk_crc32c[i], chunks[i].size());
    if (joined.crc() != payload_crc32c) return CrcMismatch(what, payload_bytes, payload_crc32c, joined.crc());
    return Status::Ok();
  }
  // Last chunk first: the receiver's I/O thread wrote it last, so it is the part most likely
  // still in cache; reading forward would evict it before reaching it. The chunk CRCs are
  // combined into the payload's.
  uint32_t crc = 0;
  uint64_t tail = 0;  // bytes after the current chunk
  for (size_t i = chunks.size(); i-- > 0;) {
    const uint32_t c = Crc32c(chunks[i].data(), chunks[i].size());
    crc = Crc32cCombine(c, crc, tail);
    tail += chunks[i].size();
  }
  if (crc != payload_crc32c) return CrcMismatch(what, payload_bytes, payload_crc32c, crc);
  return Status::Ok();
}

Status ReassembleChunks(std::span<const std::span<const uint8_t>> chunks, uint64_t payload_bytes,
                        uint32_t payload_crc32c, std::string_view what,
                        ParsedMessage::Bytes* out) {
  DL_RETURN_IF_ERROR(CheckChunkSizes(chunks, payload_bytes, what));
  out->resize(payload_bytes);
  uint32_t crc = 0;
  uint64_t pos = 0;
  for (const auto& c : chunks) {
    // One pass over each chunk: copy and CRC together.
    crc = Crc32cCopy(out->data() + pos, c.data(), c.size(), crc);
    pos += c.size();
  }
  if (crc != payload_crc32c) return CrcMismatch(what, payload_bytes, payload_crc32c, crc);
  return Status::Ok();
}
}  // namespace diloco
