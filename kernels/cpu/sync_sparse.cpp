// The chunked top-k codec's chunk records and error feedback's accumulator: the arithmetic is
// pinned in kernels/sync_sparse.h (this file is compiled with -ffp-contract=off).
#include "kernels/sync_sparse.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>

namespace diloco {
namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;

struct BitWriter {
  uint8_t* p;
  uint64_t acc = 0;
  int n = 0;
  void Put(uint32_t v, int bits) {
    acc |= static_cast<uint64_t>(v) << n;
    n += bits;
    while (n >= 8) {
      *p++ = static_cast<uint8_t>(acc);
      acc >>= 8;
      n -= 8;
    }
  }
  void Flush() {
    if (n > 0) *p++ = static_cast<uint8_t>(acc);  // pad bits are 0
    acc = 0;
    n = 0;
  }
};

struct BitReader {
  const uint8_t* p;
  uint64_t acc = 0;
  int n = 0;
  uint32_t Get(int bits) {
    while (n < bits) {
      acc |= static_cast<uint64_t>(*p++) << n;
      n += 8;
    }
    const uint32_t v = static_cast<uint32_t>(acc & ((uint64_t{1} << bits) - 1));
    acc >>= bits;
    n -= bits;
    return v;
  }
  bool PadIsZero() const { return acc == 0; }  // the bits left of the last byte read
};

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// The threshold guess of the selection: a |x| above which about kc of len values of a Gaussian
// chunk lie (a little below, so that one pass usually finds enough). Only speed depends on it:
// the selection is exact whatever the guess.
float GuessThreshold(const float* x, size_t len, size_t kc) {
  if (kc >= len) return 0.0f;
  float lane[16] = {};  // 16 partial sums so the loop vectorizes (order does not matter here)
  size_t i = 0;
  for (; i + 16 <= len; i += 16)
    for (int l = 0; l < 16; l++) lane[l] += x[i + l] * x[i + l];
  double ss = 0;
  for (; i < len; i++) ss += static_cast<double>(x[i]) * x[i];
  for (float v : lane) ss += v;
  const double sigma = std::sqrt(ss / static_cast<double>(len));
  const double z = std::sqrt(2.0 * std::log(static_cast<double>(len) / static_cast<double>(kc))) - 0.7;
  return z > 0 && std::isfinite(sigma) ? static_cast<float>(sigma * z) : 0.0f;
}

}  // namespace

int sparse_index_bits(size_t chunk) { return chunk <= 2 ? 1 : std::bit_width(chunk - 1); }

size_t sparse_keep_of(size_t len, size_t chunk, size_t keep) {
  if (len == 0) return 0;
  const size_t k = CeilDiv(keep * len, chunk);
  return std::min(len, std::max<size_t>(1, k));
}

size_t sparse_record_bytes(size_t kc, size_t chunk, int bits) {
  return sizeof(float) + CeilDiv(kc * sparse_index_bits(chunk), 8) + CeilDiv(kc * static_cast<size_t>(bits), 8);
}

size_t sparse_records_bytes(size_t n, size_t chunk, size_t keep, int bits) {
  if (chunk == 0) return 0;
  const size_t full = n / chunk, rest = n % chunk;
  size_t bytes = full * sparse_record_bytes(sparse_keep_of(chunk, chunk, keep), chunk, bits);
  if (rest > 0) bytes += sparse_record_bytes(sparse_keep_of(rest, chunk, keep), chunk, bits);
  return bytes;
}

void sparse_encode_chunk(uint8_t* record, const float* x, size_t len, size_t kc, size_t chunk, int bits,
                         uint64_t* scratch) {
  // Candidates: (|x| bits << 32) | ~index, so that the larger key is the larger |x|, then the
  // lower index: a strict total order, so the kc largest are one set whatever finds them.
  uint64_t* cand = scratch;
  uint64_t* kept = scratch + len;
  float t = GuessThreshold(x, len, kc);
  size_t m = 0;
  for (;;) {
    const uint32_t tkey = std::bit_cast<uint32_t>(t) & kAbsMask;
    m = 0;
    for (size_t i = 0; i < len; i++) {
      const uint32_t key = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
      cand[m] = (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(i));
      m += key >= tkey ? 1 : 0;
    }
    if (m >= kc) break;
    t = t > 1e-30f ? t * 0.25f : 0.0f;  // t = 0 takes every value
  }
  if (m > kc) std::nth_element(cand, cand + (kc - 1), cand + m, std::greater<uint64_t>());
  for (size_t j = 0; j < kc; j++) kept[j] = static_cast<uint32_t>(~static_cast<uint32_t>(cand[j]));
  std::sort(kept, kept + kc);

  // The scale: sigma of the kept values, in index order, in double.
  double ss = 0;
  for (size_t j = 0; j < kc; j++) {
    const double v = x[kept[j]];
    ss += v * v;
  }
  const int levels = 1 << bits;
  const double sigma = std::sqrt(ss / static_cast<double>(kc));
  float w = static_cast<float>(sigma * (2.0 * kSparseRange / levels));
  const float inv = 1.0f / w;
  const bool zero = !std::isfinite(inv);
  if (zero) w = 0.0f;
  std::memcpy(record, &w, sizeof w);

  const int ib = sparse_index_bits(chunk);
  BitWriter idx{record + sizeof(float)};
  for (size_t j = 0; j < kc; j++) idx.Put(static_cast<uint32_t>(kept[j]), ib);
  idx.Flush();
  BitWriter codes{idx.p};
  const float lo = -static_cast<float>(levels / 2), hi = static_cast<float>(levels / 2 - 1);
  for (size_t j = 0; j < kc; j++) {
    uint32_t code = static_cast<uint32_t>(levels / 2);
    if (!zero) {
      const float u = std::floor(x[kept[j]] * inv);
      code = static_cast<uint32_t>(static_cast<int>(std::clamp(u, lo, hi)) + levels / 2);
    }
    codes.Put(code, bits);
  }
  codes.Flush();
}

SparseFault sparse_decode_chunk(float* out, const uint8_t* record, size_t len, size_t kc, size_t chunk, int bits,
                                size_t* at) {
  *at = 0;
  float w;
  std::memcpy(&w, record, sizeof w);
  const int levels = 1 << bits;
  const float top = static_cast<float>(levels / 2) - 0.5f;
  if (std::signbit(w) || !std::isfinite(w) || !std::isfinite(top * w)) return SparseFault::kBadScale;
  std::fill(out, out + len, 0.0f);
  const int ib = sparse_index_bits(chunk);
  BitReader idx{record + sizeof(float)};
  BitReader codes{record + sizeof(float) + CeilDiv(kc * ib, 8)};
  size_t next = 0;  // the smallest index the next one may take
  for (size_t j = 0; j < kc; j++) {
    *at = j;
    const size_t i = idx.Get(ib);
    if (i < next || i >= len) return SparseFault::kBadIndex;
    next = i + 1;
    const uint32_t code = codes.Get(bits);
    if (w == 0.0f && code != static_cast<uint32_t>(levels / 2)) return SparseFault::kBadCode;
    out[i] = (static_cast<float>(static_cast<int>(code) - levels / 2) + 0.5f) * w;
  }
  *at = kc;
  if (!idx.PadIsZero() || !codes.PadIsZero()) return SparseFault::kBadPad;
  return SparseFault::kNone;
}

void sync_accumulate(float* sum, const float* residual, const float* delta, float decay, size_t n) {
  if (residual == nullptr) {
    if (n > 0) std::memmove(sum, delta, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; i++) sum[i] = decay * residual[i] + delta[i];
}

}  // namespace diloco
