#include "daemon/net/stream_frames.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace diloco::net {
namespace {

uint32_t ReadU32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

void AppendU32(uint32_t v, std::vector<uint8_t>* out) {
  for (int i = 0; i < 4; i++) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t PrefixBytes(uint64_t frames) { return kStreamFixedPrefixBytes + 4 * frames; }

}  // namespace

uint64_t StreamMessageBytes(std::span<const std::span<const uint8_t>> frames) {
  uint64_t total = PrefixBytes(frames.size());
  for (const auto& f : frames) total += f.size();
  return total;
}

Status EncodeStreamMessage(std::span<const std::span<const uint8_t>> frames, const StreamFrameLimits& limits,
                           std::vector<uint8_t>* out) {
  if (frames.empty()) return Status::Error("a stream message needs at least one frame");
  if (frames.size() > limits.max_frames) {
    return Status::Error("a message of " + std::to_string(frames.size()) + " frames is over the limit of " +
                         std::to_string(limits.max_frames));
  }
  const uint64_t total = StreamMessageBytes(frames);
  if (total > limits.max_message_bytes) {
    return Status::Error("a message of " + std::to_string(total) + " bytes is over the limit of " +
                         std::to_string(limits.max_message_bytes) + " bytes");
  }
  out->reserve(out->size() + total);
  out->insert(out->end(), std::begin(kStreamMagic), std::end(kStreamMagic));
  AppendU32(static_cast<uint32_t>(frames.size()), out);
  for (const auto& f : frames) AppendU32(static_cast<uint32_t>(f.size()), out);
  for (const auto& f : frames) out->insert(out->end(), f.begin(), f.end());
  return Status::Ok();
}

size_t StreamDecoder::wanted() const {
  switch (stage_) {
    case Stage::kPrefix:
      return kStreamFixedPrefixBytes - have_;
    case Stage::kLengths:
      return lengths_raw_.size() - have_;
    case Stage::kFrames:
      return static_cast<size_t>(announced_ - buffered_);
    case Stage::kComplete:
    case Stage::kFailed:
      return 0;
  }
  return 0;
}

Status StreamDecoder::Fail(Status why) {
  stage_ = Stage::kFailed;
  frames_.clear();
  frames_.shrink_to_fit();
  lengths_raw_.clear();
  buffered_ = 0;
  return why;
}

Status StreamDecoder::EndOfPrefix() {
  if (std::memcmp(prefix_, kStreamMagic, sizeof kStreamMagic) != 0) {
    return Fail(Status::Error("sent bytes that do not start a message (not the control protocol, or a version this "
                              "daemon does not speak)"));
  }
  const uint32_t n = ReadU32(prefix_ + 4);
  if (n == 0 || n > limits_.max_frames) {
    return Fail(Status::Refused("announced a message of " + std::to_string(n) + " frames (1 to " +
                              std::to_string(limits_.max_frames) + " allowed)"));
  }
  if (PrefixBytes(n) > limits_.max_message_bytes) {
    return Fail(Status::Refused("announced " + std::to_string(n) + " frames, whose lengths alone are over the cap of " +
                              std::to_string(limits_.max_message_bytes) + " bytes"));
  }
  lengths_raw_.assign(4 * size_t{n}, 0);
  have_ = 0;
  stage_ = Stage::kLengths;
  return Status::Ok();
}

Status StreamDecoder::EndOfLengths() {
  const size_t n = lengths_raw_.size() / 4;
  lengths_.resize(n);
  uint64_t total = PrefixBytes(n);
  for (size_t i = 0; i < n; i++) {
    lengths_[i] = ReadU32(lengths_raw_.data() + 4 * i);
    total += lengths_[i];
  }
  // The cap, from the prefix alone: nothing of an oversized message is taken in.
  if (total > limits_.max_message_bytes) {
    return Fail(Status::Refused("announced a message of " + std::to_string(total) + " bytes, over the cap of " +
                              std::to_string(limits_.max_message_bytes) + " bytes"));
  }
  announced_ = total;
  frames_.assign(n, {});
  frame_ = 0;
  have_ = 0;
  stage_ = Stage::kFrames;
  NextFrame();
  return Status::Ok();
}

// Moves past frames that are full (empty ones included); completes the message after the last.
void StreamDecoder::NextFrame() {
  while (frame_ < lengths_.size() && have_ == lengths_[frame_]) {
    frame_++;
    have_ = 0;
  }
  if (frame_ == lengths_.size()) {
    stage_ = Stage::kComplete;
    return;
  }
  if (have_ == 0) frames_[frame_].reserve(lengths_[frame_]);  // within the cap checked above
}

Status StreamDecoder::Feed(std::span<const uint8_t> data, size_t* taken) {
  *taken = 0;
  while (!data.empty() && wanted() > 0) {
    const size_t n = std::min(data.size(), stage_ == Stage::kFrames ? size_t{lengths_[frame_]} - have_ : wanted());
    switch (stage_) {
      case Stage::kPrefix:
        std::memcpy(prefix_ + have_, data.data(), n);
        break;
      case Stage::kLengths:
        std::memcpy(lengths_raw_.data() + have_, data.data(), n);
        break;
      case Stage::kFrames:
        frames_[frame_].insert(frames_[frame_].end(), data.begin(), data.begin() + n);
        break;
      case Stage::kComplete:
      case Stage::kFailed:
        return Status::Ok();
    }
    have_ += n;
    buffered_ += n;
    *taken += n;
    data = data.subspan(n);
    if (stage_ == Stage::kPrefix && have_ == kStreamFixedPrefixBytes) {
      DL_RETURN_IF_ERROR(EndOfPrefix());
    } else if (stage_ == Stage::kLengths && have_ == lengths_raw_.size()) {
      DL_RETURN_IF_ERROR(EndOfLengths());
    } else if (stage_ == Stage::kFrames) {
      NextFrame();
    }
  }
  return Status::Ok();
}

std::vector<std::vector<uint8_t>> StreamDecoder::Take() {
  std::vector<std::vector<uint8_t>> out;
  if (stage_ != Stage::kComplete) return out;
  out.swap(frames_);
  lengths_.clear();
  lengths_raw_.clear();
  have_ = 0;
  frame_ = 0;
  buffered_ = 0;
  announced_ = 0;
  stage_ = Stage::kPrefix;
  return out;
}

Status DecodeStreamMessage(std::span<const uint8_t> bytes, const StreamFrameLimits& limits,
                           std::vector<std::vector<uint8_t>>* frames) {
  StreamDecoder d(limits);
  size_t taken = 0;
  DL_RETURN_IF_ERROR(d.Feed(bytes, &taken));
  if (!d.complete()) {
    return Status::Error("truncated: " + std::to_string(bytes.size()) + " bytes end inside a message" +
                         (d.announced_bytes() ? " of " + std::to_string(d.announced_bytes()) + " bytes" : ""));
  }
  if (taken != bytes.size()) {
    return Status::Error(std::to_string(bytes.size() - taken) + " bytes after the end of the message");
  }
  *frames = d.Take();
  return Status::Ok();
}

}  // namespace diloco::net
