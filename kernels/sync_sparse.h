// The chunked top-k codec's per-chunk arithmetic (the SparseLoCo layout; daemon/net/codec.h
// `topk_chunked` frames it per tensor) and the accumulator of error feedback with decay.
//
// A tensor is cut into chunks of C values (the last one may be short, L = its length). Of a chunk
// the codec keeps kc = KeepOf(L) values, kc = min(L, max(1, ceil(keep * L / C))) (keep for every
// full chunk), and writes one record, all little-endian:
//   f32 w                  the bin width (>= 0, finite)
//   ceil(kc * ib / 8) B    kc indices within the chunk, ib = max(1, bit_width(C - 1)) bits each
//                          (12 for C = 4096), strictly increasing, packed LSB first; pad bits 0
//   ceil(kc * b / 8) B     kc codes of b bits (2, 4 or 8), LSB first, in index order; pad bits 0
// so a full chunk of the defaults (C 4096, keep 64, b 2) is 4 + 96 + 16 = 116 bytes (0.0283 B/value).
//
// THE ARITHMETIC (pinned like sync_ops.h: -ffp-contract=off; fl() = one IEEE round-to-nearest-even):
//   selection  the kc values of largest |x|, compared as the sign-cleared fp32 bits (exact), ties
//              to the lower index; written in index order.
//   scale      ss = sum over the kept values, in index order, of (double)x * (double)x (exact
//              products, double sums in that order); sigma = sqrt_64(ss / kc) (IEEE division and
//              square root, correctly rounded); w = fl32(sigma * (2 * kRange / L_b)) in double,
//              where L_b = 2^b levels and 2 * kRange / L_b is exact. The bins are L_b equal bins
//              over [-kRange * sigma, +kRange * sigma] (kRange = 1.25: see the note below).
//   encode     inv = fl32(1 / w); u = fl32(x * inv); c = clamp(floor(u), -L_b/2, L_b/2 - 1);
//              code = c + L_b/2. A chunk whose inv is not finite (w = 0 or below ~2.9e-39) gets
//              w = 0 and every code L_b/2 (it decodes to zeros; error feedback carries it on).
//   decode     value = fl32((code - L_b/2 + 0.5) * w) (the half-integer factor is exact);
//              values not kept are 0.
// Why sigma of the kept values and kRange = 1.25 (measured with a throwaway program on 2048 chunks
// of 4096 synthetic values, keep 64; not real checkpoint deltas): relative L2 error of the kept
// values after 2-bit quantisation, sigma of the kept values x 1.25 / x 1.5 / x 2 against sigma of
// the whole chunk x 3 / x 4 / x 6:
//   Gaussian     0.123 / 0.171 / 0.421   against  0.211 / 0.144 / 0.421
//   Laplace      0.195 / 0.238 / 0.375   against  0.421 / 0.258 / 0.296
//   Student-t 3  0.510 / 0.493 / 0.451   against  0.676 / 0.599 / 0.525
// The kept values' own spread follows the tail the chunk actually has; the chunk's sigma needs a
// different multiple for each distribution (and a pass over all C values more). At 4 bits the
// kept sigma x 1.25 gives 0.058 (Gaussian) / 0.106 (Laplace).
//
// kernels/cpu/sync_sparse.cpp is the reference. kernels/cuda/sync_sparse.cu encodes the same
// records on the device (cuda::sparse_encode in kernels/cuda/ops.h), tested byte-identical by
// tests/kernels/test_cuda_sparse.cpp; the learner still encodes on the host (its sparse error
// feedback lives there). The decoder (CPU only) checks everything a payload could get wrong.
#pragma once

#include <cstddef>
#include <cstdint>

namespace diloco {

inline constexpr double kSparseRange = 1.25;  // bins cover +-kSparseRange * sigma(kept values)

// Index bits of a chunk size C: max(1, bit_width(C - 1)).
int sparse_index_bits(size_t chunk);
// Values kept of a chunk of len values (len <= chunk): min(len, max(1, ceil(keep * len / chunk))).
size_t sparse_keep_of(size_t len, size_t chunk, size_t keep);
// Bytes of one chunk record keeping kc values.
size_t sparse_record_bytes(size_t kc, size_t chunk, int bits);
// Bytes of n values in records (no tensor header).
size_t sparse_records_bytes(size_t n, size_t chunk, size_t keep, int bits);

// Encodes one chunk of len values (finite: the caller checks) keeping kc (1 <= kc <= len) into
// record (exactly sparse_record_bytes(kc, chunk, bits) bytes, overwritten). scratch: at least
// 2 * len uint64 (the selection's candidates).
void sparse_encode_chunk(uint8_t* record, const float* x, size_t len, size_t kc, size_t chunk, int bits,
                         uint64_t* scratch);

// What a chunk record's decoder refused.
enum class SparseFault : int {
  kNone = 0,
  kBadScale,  // w negative (sign bit set), NaN, Inf, or so large a level is not finite
  kBadIndex,  // an index >= len or not above the one before it
  kBadCode,   // w = 0 with a code other than L_b/2
  kBadPad,    // a pad bit set
};
// out (len) = the chunk's values (=). *at: the offending kept value's position (0..kc-1).
SparseFault sparse_decode_chunk(float* out, const uint8_t* record, size_t len, size_t kc, size_t chunk, int bits,
                                size_t* at);

// Error feedback's accumulator: sum = fl(fl(decay * residual) + delta) (residual may be null:
// sum = delta). decay = 1 is the plain residual's fl(residual + delta) bit for bit.
void sync_accumulate(float* sum, const float* residual, const float* delta, float decay, size_t n);

}  // namespace diloco
