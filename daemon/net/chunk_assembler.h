// Puts wire messages sent in the chunked form (chunk_frame.h) back together on the receiving
// channel, one assembly per stream (a stream: the SUB topic or ROUTER peer, and the sender named
// in the chunk frames). Every chunk is checked as it arrives: its frame, its place (the next
// index of the message being assembled), its size (kChunkBytes but the last, under the limits)
// and its CRC32C, computed over the received bytes while the next chunk is still on the wire.
// The seal completes a message whose chunks all arrived: Add then returns it as the multipart
// message [header][chunk 0]...[chunk n-1], with the CRCs it computed in chunk_info() so that the
// envelope's check combines them instead of reading the payload again.
//
// A message that cannot complete is dropped whole, with a reason (the channel counts and logs it):
// a missing, repeated or reordered chunk, a bad CRC, a chunk or seal of another message, a sender
// silent for longer than timeout_ms, too many messages in assembly at once. Once dropped, the
// rest of that message's chunks are discarded without further reasons. Memory is bounded by
// max_total_bytes and max_streams x max_payload_bytes (plus the frames ZeroMQ already holds).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/net/chunk_frame.h"
#include "daemon/net/socket.h"

namespace diloco::net {

struct ChunkAssemblerOptions {
  uint64_t max_payload_bytes = uint64_t{1} << 31;  // per message
  uint32_t max_chunks = 1023;                      // payload frames per message
  size_t max_streams = 16;                         // messages in assembly at once
  uint64_t max_total_bytes = uint64_t{8} << 30;    // chunk bytes held, all messages together
  int64_t timeout_ms = 30000;                      // a stream silent this long is dropped
};

class ChunkAssembler {
 public:
  using Time = std::chrono::steady_clock::time_point;

  struct Result {
    // The completed message (empty when none): [header][chunks...] with chunk_info() set.
    Message message;
    ChunkFrame seal;  // its stream identity, as the chunk frames state it
    // Messages dropped by this call, one reason each ("chunk 3 of 16 of seq 7 from learner-1: ...").
    std::vector<std::string> dropped;
    bool complete() const { return !message.empty(); }
  };

  explicit ChunkAssembler(ChunkAssemblerOptions options) : o_(options) {}

  // One received message [chunk frame][data] of stream `stream` (topic or peer; the sender is
  // taken from the frame). `now` decides time-outs.
  Result Add(const std::string& stream, Message&& message, Time now);
  // Drops assemblies silent for longer than timeout_ms.
  std::vector<std::string> Expire(Time now);

  size_t streams() const { return streams_.size(); }
  uint64_t bytes_held() const { return bytes_held_; }

 private:
  struct Assembly {
    uint64_t incarnation = 0, seq = 0, payload_bytes = 0;
    uint32_t count = 0;
    std::string who;  // "seq 7 from learner-1"
    bool dead = false;  // dropped: the rest of its chunks are discarded quietly
    std::vector<zmq::message_t> chunks;
    std::vector<uint32_t> crcs;
    uint64_t bytes = 0;
    Time last;
  };
  static bool Same(const Assembly& a, const ChunkFrame& f) { return a.incarnation == f.incarnation && a.seq == f.seq; }
  // Drops a (keeping it as dead so that its later chunks are discarded) and says why.
  void Kill(Assembly* a, const std::string& why, std::vector<std::string>* dropped);
  void Erase(std::map<std::string, Assembly>::iterator it);
  void AddChunk(const std::string& key, const ChunkFrame& f, zmq::message_t&& data, Time now, Result* r);
  void AddSeal(const std::string& key, const ChunkFrame& f, zmq::message_t&& header, Time now, Result* r);
  // A chunk frame's own fields against the limits; "" when fine.
  std::string CheckFrame(const ChunkFrame& f, size_t data_bytes) const;
  void EvictOldest(std::vector<std::string>* dropped);

  ChunkAssemblerOptions o_;
  std::map<std::string, Assembly> streams_;
  uint64_t bytes_held_ = 0;
};

}  // namespace diloco::net
