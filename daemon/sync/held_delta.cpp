#include "daemon/sync/held_delta.h"

#include "daemon/sync/protocol.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace diloco {
namespace {

std::vector<double> RangeNorms(const Fragment& fragment, std::span<const float> values) {
  std::vector<double> norms;
  norms.reserve(fragment.ranges.size());
  for (const FragmentRange& r : fragment.ranges) norms.push_back(RangeNorm(values.data() + r.packed_offset, r.numel));
  return norms;
}

}  // namespace

HeldDelta HoldValues(const Fragment& fragment, std::span<const float> values) {
  HeldDelta h;
  h.values.assign(values.begin(), values.end());
  h.range_norms = RangeNorms(fragment, values);
  return h;
}

Status HoldPayload(const Fragment& fragment, const CodecOptions& codec,
                   std::span<const std::span<const uint8_t>> chunks, std::span<const uint64_t> tensor_bytes,
                   HeldDelta* held, TaskPool* pool) {
  DL_RETURN_IF_ERROR(ValidateDecodeOptions(codec));
  const size_t R = fragment.ranges.size();
  if (tensor_bytes.size() != R)
    return Status::Error(std::to_string(tensor_bytes.size()) + " tensors for " + std::to_string(R) + " ranges");
  // Built in *held, in whatever buffers it brings (HeldDeltaRecycler).
  HeldDelta& h = *held;
  h.payload.clear();
  h.payload_at.clear();
  h.values.clear();
  h.range_norms.clear();
  if (IsSparseCodec(codec) || codec.kind == CodecKind::kFp32) {
    h.codec = CodecOptions{CodecKind::kFp32, codec.block_size, 0};
    h.values.resize(fragment.numel);
    DL_RETURN_IF_ERROR(DecodeTensors(codec, chunks, FragmentNumels(fragment), tensor_bytes, h.values));
    h.range_norms = RangeNorms(fragment, h.values);
    return Status::Ok();
  }
  h.codec = codec;
  size_t total = 0;
  for (const auto& c : chunks) total += c.size();
  h.payload_at.resize(R);
  uint64_t offset = 0;
  for (size_t t = 0; t < R; t++) {
    const uint64_t want = EncodedBytes(codec.kind, fragment.ranges[t].numel, codec.block_size);
    if (tensor_bytes[t] != want)
      return Status::Error("tensor " + std::to_string(t) + ": " + std::string(CodecName(codec.kind)) + " payload is " +
                           std::to_string(tensor_bytes[t]) + " bytes, its " + std::to_string(fragment.ranges[t].numel) +
                           " values need " + std::to_string(want) + "; the message's shape and payload disagree");
    h.payload_at[t] = offset;
    offset += want;
  }
  if (offset != total)
    return Status::Error("the tensors take " + std::to_string(offset) + " bytes but the payload has " +
                         std::to_string(total));
  h.payload.resize(total);
  size_t at = 0;
  for (const auto& c : chunks) {
    if (!c.empty()) std::memcpy(h.payload.data() + at, c.data(), c.size());
    at += c.size();
  }
  // Decode (and so check) every chunk once, as a merge will read it, summing its squares.
  std::vector<size_t> first;
  const std::vector<MergeChunk> work = ChunkFragment(fragment, &first);
  std::vector<double> squares(work.size(), 0.0);
  std::vector<Status> errors(work.size());
  const HeldDeltaReader reader(fragment, h);
  // A merge tile at a time: the decoded values stay in L1 (the sums are those of the whole chunk).
  std::vector<std::vector<float>> scratches(pool != nullptr ? pool->threads() : 1);  // per worker
  RunTasks(pool, work.size(), [&](size_t t, int worker) {
    std::vector<float>& scratch = scratches[worker];
    const MergeChunk& c = work[t];
    SquareSum sum;
    for (size_t at = 0; at < c.n; at += kMergeTile) {
      const size_t n = std::min(kMergeTile, c.n - at);
      const float* v = nullptr;
      errors[t] = reader.Read(c.range, c.begin + at, n, &scratch, &v);
      if (!errors[t].ok()) return;
      sum.Add(v, n);
    }
    squares[t] = sum.Total();
  });
  for (size_t t = 0; t < work.size(); t++)
    DL_RETURN_IF_ERROR(errors[t].WithContext("tensor " + std::to_string(work[t].range)));
  h.range_norms.assign(R, 0.0);
  for (size_t r = 0; r < R; r++) {
    double sum = 0;
    for (size_t t = first[r]; t < first[r + 1]; t++) sum += squares[t];
    h.range_norms[r] = std::sqrt(sum);
  }
  return Status::Ok();
}

void HeldDeltaRecycler::Give(HeldDelta&& held) {
  if (held.payload.capacity() > 0 && payloads_.size() < max_kept_) payloads_.push_back(std::move(held.payload));
  if (held.values.capacity() > 0 && values_.size() < max_kept_) values_.push_back(std::move(held.values));
  held = HeldDelta();
}

namespace {

// The kept buffer with room for n (the first such), else the largest; empty when none is kept.
template <typename T>
std::vector<T> TakeBuffer(std::vector<std::vector<T>>* kept, size_t n) {
  if (kept->empty() || n == 0) return {};
  size_t pick = 0;
  for (size_t i = 0; i < kept->size(); i++) {
    if ((*kept)[i].capacity() >= n) {
      pick = i;
      break;
    }
    if ((*kept)[i].capacity() > (*kept)[pick].capacity()) pick = i;
  }
  std::vector<T> out = std::move((*kept)[pick]);
  (*kept)[pick] = std::move(kept->back());
  kept->pop_back();
  return out;
}

}  // namespace

HeldDelta HeldDeltaRecycler::Take(size_t payload_bytes, size_t values) {
  HeldDelta h;
  h.payload = TakeBuffer(&payloads_, payload_bytes);
  h.values = TakeBuffer(&values_, values);
  return h;
}

Status DecodeHeld(const Fragment& fragment, const HeldDelta& held, std::vector<float>* out) {
  out->resize(fragment.numel);
  HeldDeltaReader reader(fragment, held);
  std::vector<float> scratch;
  for (size_t r = 0; r < fragment.ranges.size(); r++) {
    const FragmentRange& fr = fragment.ranges[r];
    const float* v = nullptr;
    DL_RETURN_IF_ERROR(reader.Read(r, 0, fr.numel, &scratch, &v));
    std::copy(v, v + fr.numel, out->data() + fr.packed_offset);
  }
  return Status::Ok();
}

Status HeldDeltaReader::Read(size_t range, size_t begin, size_t n, std::vector<float>* scratch,
                             const float** values) const {
  const FragmentRange& r = fragment_->ranges[range];
  const HeldDelta& h = *held_;
  if (begin > r.numel || n > r.numel - begin) return Status::Error("read past the end of " + RangeName(r));
  if (h.payload.empty() && !h.values.empty()) {
    *values = h.values.data() + r.packed_offset + begin;
    return Status::Ok();
  }
  const CodecKind kind = h.codec.kind;
  const int B = h.codec.block_size;
  const uint8_t* tensor = h.payload.data() + h.payload_at[range];
  if (kind == CodecKind::kBf16) {
    scratch->resize(n);
    DL_RETURN_IF_ERROR(
        DecodeDense(kind, B, std::span(tensor + 2 * begin, 2 * n), std::span(scratch->data(), n)));
    *values = scratch->data();
    return Status::Ok();
  }
  // int8 / int4: the range decodes from the whole blocks [a, e) around it, where they lie.
  const size_t a = begin / B * B;
  const size_t e = std::min<size_t>(r.numel, (begin + n + B - 1) / B * B);
  scratch->resize(e - a);
  DL_RETURN_IF_ERROR(DecodeTensorBlocks(kind, B, std::span(tensor, EncodedBytes(kind, r.numel, B)), r.numel, a,
                                        std::span(scratch->data(), e - a)));
  *values = scratch->data() + (begin - a);
  return Status::Ok();
}

}  // namespace diloco
