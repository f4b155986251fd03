// Multipart messages on a byte stream (the local control socket, local_socket.h): pure encode and
// decode, with a cap on a whole message that is checked from the length prefix before any of the
// message's frames are taken in.
//
// One message on the stream (integers little-endian):
//   magic      4 bytes  "DLC" 0x01 (version 1)
//   n          u32      frames, 1 .. limits.max_frames
//   lengths    n x u32  each frame's bytes
//   frames     the n frames, back to back
// The whole of it, prefix included, is at most limits.max_message_bytes: a decoder that reads a
// larger announcement refuses it having held only the prefix (8 + 4 n bytes).
//
// Why not ZeroMQ for this: libzmq 4.3 caps each frame (ZMQ_MAXMSGSIZE), not a message, and holds an
// unterminated multipart message out of the application's sight, so a local client could grow a
// daemon without bound by never sending a message's last frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "daemon/util/status.h"

namespace diloco::net {

struct StreamFrameLimits {
  size_t max_frames = 16;                          // frames in one message
  uint64_t max_message_bytes = uint64_t{2} << 20;  // one whole message, prefix included
};

inline constexpr uint8_t kStreamMagic[4] = {'D', 'L', 'C', 0x01};
inline constexpr size_t kStreamFixedPrefixBytes = 8;  // magic + n

// The encoded size of a message of these frames.
uint64_t StreamMessageBytes(std::span<const std::span<const uint8_t>> frames);

// Appends one encoded message to *out. An error (and *out unchanged) when frames break limits.
Status EncodeStreamMessage(std::span<const std::span<const uint8_t>> frames, const StreamFrameLimits& limits,
                           std::vector<uint8_t>* out);

// Takes a stream in pieces of any size and puts its messages back together, one at a time: it
// takes no byte past the end of the current message (wanted() says how many it takes now), so a
// reader that reads at most wanted() bytes holds at most one message, never more than
// limits.max_message_bytes. Once Feed has returned an error the decoder stays failed; the stream
// cannot be trusted after it (close it).
class StreamDecoder {
 public:
  explicit StreamDecoder(const StreamFrameLimits& limits = {}) : limits_(limits) {}

  // Bytes the decoder would take now: > 0 while a message is incomplete, 0 once one is complete
  // (Take it) or after an error.
  size_t wanted() const;
  // Takes up to wanted() bytes of data (*taken says how many); an error when they break the
  // limits (code kRefused) or the format (kError), saying what the stream did.
  Status Feed(std::span<const uint8_t> data, size_t* taken);
  bool complete() const { return stage_ == Stage::kComplete; }
  bool failed() const { return stage_ == Stage::kFailed; }
  // The complete message's frames; the decoder starts on the next message.
  std::vector<std::vector<uint8_t>> Take();

  // Bytes of the current message taken so far (prefix included): what the decoder holds.
  uint64_t buffered_bytes() const { return buffered_; }
  // The current message's announced size once its prefix is in (0 before).
  uint64_t announced_bytes() const { return announced_; }
  bool mid_message() const { return buffered_ > 0; }

 private:
  enum class Stage { kPrefix, kLengths, kFrames, kComplete, kFailed };
  Status Fail(Status why);
  Status EndOfPrefix();
  Status EndOfLengths();
  void NextFrame();

  StreamFrameLimits limits_;
  Stage stage_ = Stage::kPrefix;
  uint8_t prefix_[kStreamFixedPrefixBytes] = {};
  std::vector<uint8_t> lengths_raw_;  // n x u32
  std::vector<uint32_t> lengths_;
  std::vector<std::vector<uint8_t>> frames_;
  size_t have_ = 0;        // bytes of the current stage's piece (prefix, lengths, frame) so far
  size_t frame_ = 0;       // the frame being filled
  uint64_t buffered_ = 0;
  uint64_t announced_ = 0;
};

// The whole of bytes as exactly one message: an error when it breaks the limits, is cut short
// (truncated) or has bytes after the message.
Status DecodeStreamMessage(std::span<const uint8_t> bytes, const StreamFrameLimits& limits,
                           std::vector<std::vector<uint8_t>>* frames);

}  // namespace diloco::net
