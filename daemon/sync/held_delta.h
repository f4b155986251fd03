// A delta as the syncer holds it while its round is open: the encoded bytes as they came (int8,
// int4, bf16), or the values themselves (fp32, top-k), plus |Δ| per range.
//
// Why encoded, not accumulated as deltas arrive: a merge must give the same bits whatever order
// the deltas arrived in (merge.h: sums run in learner order). Running float sums (Σ w·Δ, the RDA
// sums) taken at arrival depend on arrival order, and the weights are normalized over the
// contributors, who are known only when the round closes; an order-independent exact sum (fixed
// point) needs a range fixed before the first delta is seen, which a delta's scale does not give.
// So the round keeps each delta in its wire encoding and the merge decodes it chunk by chunk, in
// learner order, straight into the sums (HeldDeltaReader): no decoded copy per learner is ever
// held, and the bits are those of merging the decoded deltas. Memory per pending delta: its
// payload, 0.5625 bytes per parameter for int4 (B = 64), 1/7 of a decoded fp32 copy; fp32
// deltas cost what they did.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "daemon/net/codec.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/merge.h"
#include "daemon/util/status.h"

namespace diloco {

struct HeldDelta {
  CodecOptions codec{CodecKind::kFp32, kDefaultCodecBlock, 0};  // of payload (kFp32: values)
  std::vector<uint8_t> payload;         // range after range (EncodeTensors); empty for fp32
  std::vector<uint64_t> payload_at;     // per range: where its bytes start in payload
  std::vector<float> values;            // fp32: the fragment's packed delta
  std::vector<double> range_norms;      // |Δ| per range (RangeNorm of the decoded values)
  size_t bytes() const { return payload.size() + values.size() * sizeof(float); }
};

// Holds an arriving delta: its payload (chunks, tensor_bytes[i] bytes for range i of fragment,
// encoded with codec) is copied (int8 / int4 / bf16) and decoded a chunk at a time into a small
// scratch, which checks it as DecodeTensors does (sizes, scales, codes, finite values) and gives
// |Δ| per range, without a decoded copy of the whole fragment; fp32 and top-k payloads are
// decoded into held values. An error means the payload is bad (the delta is refused). With a
// pool the chunks are checked in parallel (the same norms: per chunk, then added in order).
Status HoldPayload(const Fragment& fragment, const CodecOptions& codec,
                   std::span<const std::span<const uint8_t>> chunks, std::span<const uint64_t> tensor_bytes,
                   HeldDelta* held, TaskPool* pool = nullptr);
// Buffers of merged deltas, kept for the next arrivals: a fresh fragment-sized allocation has its
// pages faulted in anew every time. Give after a merge; Take before HoldPayload (which reuses
// what the HeldDelta brings). At most max_kept buffers of each kind are kept (the syncer: as many
// as can be pending at once, so what it keeps never exceeds what it held at its peak).
class HeldDeltaRecycler {
 public:
  explicit HeldDeltaRecycler(size_t max_kept) : max_kept_(max_kept) {}
  void Give(HeldDelta&& held);
  // An empty HeldDelta with kept buffers for payload_bytes encoded bytes and `values` floats
  // (those with room when there are: no allocation then).
  HeldDelta Take(size_t payload_bytes, size_t values);

 private:
  size_t max_kept_;
  std::vector<std::vector<uint8_t>> payloads_;
  std::vector<std::vector<float>> values_;
};

// Holds decoded values (fragment.numel) as they are.
HeldDelta HoldValues(const Fragment& fragment, std::span<const float> values);
// The whole delta decoded (tests, logs).
Status DecodeHeld(const Fragment& fragment, const HeldDelta& held, std::vector<float>* out);

// A held delta as a merge reads it: int8 / int4 / bf16 chunks decode into the thread's scratch
// (whole codec blocks around the chunk), fp32 values are read where they are. Its decoded values
// are exactly those of decoding the whole payload.
class HeldDeltaReader final : public DeltaReader {
 public:
  HeldDeltaReader(const Fragment& fragment, const HeldDelta& held) : fragment_(&fragment), held_(&held) {}
  Status Read(size_t range, size_t begin, size_t n, std::vector<float>* scratch,
              const float** values) const override;
  double RangeNorm(size_t range) const override { return held_->range_norms[range]; }

 private:
  const Fragment* fragment_;
  const HeldDelta* held_;
};

}  // namespace diloco
