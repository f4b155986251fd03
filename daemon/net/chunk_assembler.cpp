#include "daemon/net/chunk_assembler.h"

#include "daemon/net/wire_constants.h"
#include "daemon/util/crc32c.h"

namespace diloco::net {
namespace {

std::string Str(uint64_t v) { return std::to_string(v); }

// "seq 7 from learner-1"
std::string Who(const ChunkFrame& f) { return "seq " + Str(f.seq) + " from " + f.sender; }

uint64_t ChunkBytesAt(uint64_t payload_bytes, uint32_t index) {
  const uint64_t begin = uint64_t{index} * kChunkBytes;
  return payload_bytes - begin < kChunkBytes ? payload_bytes - begin : kChunkBytes;
}

}  // namespace

void ChunkAssembler::Erase(std::map<std::string, Assembly>::iterator it) {
  bytes_held_ -= it->second.bytes;
  streams_.erase(it);
}

void ChunkAssembler::Kill(Assembly* a, const std::string& why, std::vector<std::string>* dropped) {
  if (!a->dead) {
    dropped->push_back("chunked message " + a->who + " dropped after " + Str(a->chunks.size()) + " of " +
                       Str(a->count) + " chunks: " + why);
  }
  a->dead = true;
  a->chunks.clear();
  a->crcs.clear();
  bytes_held_ -= a->bytes;
  a->bytes = 0;
}

std::string ChunkAssembler::CheckFrame(const ChunkFrame& f, size_t data_bytes) const {
  if (f.count == 0 || f.count > o_.max_chunks) {
    return "declares " + Str(f.count) + " chunks (at most " + Str(o_.max_chunks) + ")";
  }
  if (f.payload_bytes > o_.max_payload_bytes) {
    return "declares " + Str(f.payload_bytes) + " payload bytes, over the limit of " + Str(o_.max_payload_bytes);
  }
  const uint64_t want = (f.payload_bytes + kChunkBytes - 1) / kChunkBytes;
  if (want != f.count) {
    return "declares " + Str(f.count) + " chunks for " + Str(f.payload_bytes) + " bytes (want " + Str(want) +
           " of at most 4 MiB)";
  }
  if (f.kind == ChunkKind::kSeal) {
    return f.index == f.count ? "" : "seal at index " + Str(f.index) + ", not " + Str(f.count);
  }
  if (f.index >= f.count) return "chunk index " + Str(f.index) + " of " + Str(f.count);
  const uint64_t size = ChunkBytesAt(f.payload_bytes, f.index);
  if (data_bytes != size) {
    return "chunk " + Str(f.index) + " has " + Str(data_bytes) + " bytes, want " + Str(size);
  }
  return "";
}

void ChunkAssembler::EvictOldest(std::vector<std::string>* dropped) {
  auto oldest = streams_.end();
  for (auto it = streams_.begin(); it != streams_.end(); ++it) {
    if (oldest == streams_.end() || it->second.last < oldest->second.last) oldest = it;
  }
  if (oldest == streams_.end()) return;
  Assembly& a = oldest->second;
  if (!a.dead) {
    dropped->push_back("chunked message " + a.who + " dropped after " +
                       Str(a.chunks.size()) + " of " + Str(a.count) + " chunks: more than " +
                       Str(o_.max_streams) + " messages in assembly at once");
  }
  Erase(oldest);
}

ChunkAssembler::Result ChunkAssembler::Add(const std::string& stream, Message&& message, Time now) {
  Result r;
  r.dropped = Expire(now);
  ChunkFrame f;
  if (message.size() != 2) {
    r.dropped.push_back("chunk message of " + Str(message.size()) + " frames (want 2: chunk frame, data)");
    return r;
  }
  if (Status st = DecodeChunkFrame(message.frame(0), &f); !st.ok()) {
    r.dropped.push_back(st.message());
    return r;
  }
  // Streams are per sender within the topic (or peer): "\0" cannot occur in a topic prefix match.
  const std::string key = stream + std::string(1, '\0') + f.sender;
  zmq::message_t data = std::move(message.frames()[1]);
  if (f.kind == ChunkKind::kChunk) {
    AddChunk(key, f, std::move(data), now, &r);
  } else {
    AddSeal(key, f, std::move(data), now, &r);
  }
  return r;
}

void ChunkAssembler::AddChunk(const std::string& key, const ChunkFrame& f, zmq::message_t&& data, Time now,
                              Result* r) {
  auto it = streams_.find(key);
  if (it != streams_.end() && !Same(it->second, f)) {
    // A new message on this stream: the one before can no longer complete.
    Kill(&it->second, "a chunk of " + Who(f) + " arrived before its seal", &r->dropped);
    Erase(it);
    it = streams_.end();
  }
  if (it != streams_.end() && it->second.dead) {
    it->second.last = now;
    return;
  }
  std::string bad = CheckFrame(f, data.size());
  if (bad.empty() && it == streams_.end() && f.index != 0) {
    bad = "chunk " + Str(f.index) + " came first (chunks 0.." + Str(f.index - 1) + " missing)";
  }
  if (it == streams_.end()) {
    if (streams_.size() >= o_.max_streams) EvictOldest(&r->dropped);
    Assembly& a = streams_[key];
    a.incarnation = f.incarnation;
    a.seq = f.seq;
    a.count = f.count;
    a.payload_bytes = f.payload_bytes;
    a.who = Who(f);
    a.last = now;
    if (bad.empty()) {
      a.chunks.reserve(f.count);
      a.crcs.reserve(f.count);
    }
    it = streams_.find(key);
  }
  if (!bad.empty()) {
    // Kept as dead: the rest of this message is discarded without a reason each.
    Kill(&it->second, bad, &r->dropped);
    return;
  }
  Assembly& a = it->second;
  a.last = now;
  if (f.count != a.count || f.payload_bytes != a.payload_bytes) {
    Kill(&a, "chunk " + Str(f.index) + " declares " + Str(f.count) + " chunks of " + Str(f.payload_bytes) +
         " bytes, the first declared " + Str(a.count) + " of " + Str(a.payload_bytes), &r->dropped);
    return;
  }
  if (f.index != a.chunks.size()) {
    Kill(&a, "chunk " + Str(f.index) + " arrived where chunk " + Str(a.chunks.size()) + " was due (" +
         (f.index < a.chunks.size() ? "repeated" : "missing or reordered") + ")", &r->dropped);
    return;
  }
  // The check that overlaps the transfer: the next chunk is on the wire meanwhile.
  const uint32_t crc = Crc32c(data.data(), data.size());
  if (crc != f.crc32c) {
    Kill(&a, "chunk " + Str(f.index) + " CRC32C mismatch (declared " + Str(f.crc32c) + ", computed " + Str(crc) +
         "): corrupted in transit", &r->dropped);
    return;
  }
  if (bytes_held_ + data.size() > o_.max_total_bytes) {
    Kill(&a, "the messages in assembly would hold more than " + Str(o_.max_total_bytes) + " bytes", &r->dropped);
    return;
  }
  a.bytes += data.size();
  bytes_held_ += data.size();
  a.crcs.push_back(crc);
  a.chunks.push_back(std::move(data));
}

void ChunkAssembler::AddSeal(const std::string& key, const ChunkFrame& f, zmq::message_t&& header, Time now,
                             Result* r) {
  auto it = streams_.find(key);
  if (it == streams_.end() || !Same(it->second, f)) {
    if (it != streams_.end()) {
      Kill(&it->second, "the seal of " + Who(f) + " arrived before its own", &r->dropped);
      Erase(it);
    }
    r->dropped.push_back("seal of " + Who(f) + " without its chunks (all " + Str(f.count) + " missing)");
    return;
  }
  Assembly& a = it->second;
  if (a.dead) {
    Erase(it);
    return;
  }
  const std::string bad = CheckFrame(f, 0);
  if (!bad.empty() || f.count != a.count || f.payload_bytes != a.payload_bytes || a.chunks.size() != a.count) {
    const std::string why = !bad.empty() ? "seal: " + bad
                            : a.chunks.size() != a.count
                                ? "sealed after " + Str(a.chunks.size()) + " of " + Str(a.count) + " chunks"
                                : "the seal declares other sizes than the chunks";
    Kill(&a, why, &r->dropped);
    Erase(it);
    return;
  }
  auto info = std::make_shared<ChunkInfo>();
  info->sender = f.sender;
  info->incarnation = f.incarnation;
  info->seq = f.seq;
  info->payload_bytes = f.payload_bytes;
  info->crc32c = std::move(a.crcs);
  r->message.AddFrame(std::move(header));
  for (zmq::message_t& c : a.chunks) r->message.AddFrame(std::move(c));
  r->message.set_chunk_info(std::move(info));
  r->seal = f;
  (void)now;
  bytes_held_ -= a.bytes;
  a.bytes = 0;
  streams_.erase(it);
}

std::vector<std::string> ChunkAssembler::Expire(Time now) {
  std::vector<std::string> dropped;
  for (auto it = streams_.begin(); it != streams_.end();) {
    const auto idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.last).count();
    if (idle_ms <= o_.timeout_ms) {
      ++it;
      continue;
    }
    Assembly& a = it->second;
    if (!a.dead) {
      dropped.push_back("chunked message " + a.who + " dropped after " + Str(a.chunks.size()) + " of " +
                        Str(a.count) + " chunks: its sender was silent for " + Str(idle_ms) + " ms (limit " +
                        Str(o_.timeout_ms) + ")");
    }
    bytes_held_ -= a.bytes;
    it = streams_.erase(it);
  }
  return dropped;
}

}  // namespace diloco::net
