#include "kernels/sync_ops.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace diloco {

namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

uint32_t float_bits(float x) { return std::bit_cast<uint32_t>(x); }

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// bf16 bits of x, round-to-nearest-even (x finite).
uint16_t bf16_bits(float x) {
  const uint32_t b = float_bits(x);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// round-half-even(x * inv_scale) of the EXACT product: one fused
// multiply-add with 1.5 * 2^23 puts the integer in the low mantissa bits
// (exact for |x * inv_scale| < 2^22). This is what daemon/net/codec.cpp's
// `x * inv_scale + 1.5*2^23` compiles to with FMA contraction (GCC's C++
// default, -march=native); a build without contraction rounds the product
// first and differs on exact ties. std::fma pins it here.
int32_t round_product_half_even(float x, float inv_scale) {
  return std::bit_cast<int32_t>(std::fma(x, inv_scale, 12582912.0f)) - 0x4b400000;
}

size_t num_blocks(size_t n, int block) { return (n + block - 1) / block; }

// int4 code c decodes to kInt4Levels[c] * scale, scale = the block's absmax
// (daemon/net/codec.h): the 16 Lloyd-Max levels of a Gaussian scaled to +-1.
constexpr float kInt4Levels[16] = {
    -1.0f,       -0.7571544f, -0.5921467f, -0.4597087f, -0.344873f,  -0.2403572f, -0.1420259f, -0.0469882f,
    0.0469882f,  0.1420259f,  0.2403572f,  0.344873f,   0.4597087f,  0.5921467f,  0.7571544f,  1.0f};

// The nearest level to v = x / absmax: m = how many of the 7 positive
// midpoints |v| exceeds; level 8 + m for v >= 0, 7 - m for v < 0 (a value on
// a midpoint takes the level nearer to zero).
uint32_t int4_code(float v) {
  uint32_t m = 0;
  for (int k = 0; k < 7; k++) m += std::fabs(v) > 0.5f * (kInt4Levels[8 + k] + kInt4Levels[9 + k]);
  return v < 0.0f ? 7 - m : 8 + m;
}

// The largest |x| of x[0..len) into *amax; false when some x is NaN or Inf.
bool block_absmax(const float* x, size_t len, float* amax) {
  *amax = 0.0f;
  for (size_t i = 0; i < len; i++) {
    if ((float_bits(x[i]) & kAbsMask) >= kInfBits) return false;
    *amax = std::max(*amax, std::fabs(x[i]));
  }
  return true;
}

// Encodes sum (n) into payload; false on non-finite input.
bool encode(uint8_t* payload, const float* sum, SyncCodec kind, int block, size_t n) {
  switch (kind) {
    case SyncCodec::kFp32:
      for (size_t i = 0; i < n; i++) {
        if ((float_bits(sum[i]) & kAbsMask) >= kInfBits) return false;
        store<float>(payload + 4 * i, sum[i]);
      }
      return true;
    case SyncCodec::kBf16:
      for (size_t i = 0; i < n; i++) {
        if ((float_bits(sum[i]) & kAbsMask) >= kInfBits) return false;
        const uint16_t r = bf16_bits(sum[i]);
        if ((r & 0x7fffu) >= 0x7f80u) return false;  // rounds to Inf
        store<uint16_t>(payload + 2 * i, r);
      }
      return true;
    case SyncCodec::kInt4: {
      const size_t nb = num_blocks(n, block);
      uint8_t* codes = payload + 4 * nb;
      std::memset(codes, 0, (n + 1) / 2);
      for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * block, len = std::min<size_t>(block, n - lo);
        float amax;
        if (!block_absmax(sum + lo, len, &amax)) return false;
        const bool zero = !(127.0f / amax <= FLT_MAX);  // all zero, or absmax < ~3.7e-37
        const float inv_scale = zero ? 0.0f : 1.0f / amax;
        store<float>(payload + 4 * b, zero ? 0.0f : amax);
        for (size_t i = lo; i < lo + len; i++) codes[i / 2] |= (uint8_t)(int4_code(sum[i] * inv_scale) << (4 * (i % 2)));
      }
      return true;
    }
    case SyncCodec::kInt8: {
      const int qmax = 127;
      const float max_scale = sync_max_scale(qmax);
      const size_t nb = num_blocks(n, block);
      uint8_t* codes = payload + 4 * nb;
      for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * block, len = std::min<size_t>(block, n - lo);
        float amax;
        if (!block_absmax(sum + lo, len, &amax)) return false;
        float inv_scale = (float)qmax / amax;  // Inf for an all-zero block
        float scale = std::min(amax / (float)qmax, max_scale);
        if (!(inv_scale <= FLT_MAX)) inv_scale = scale = 0.0f;
        store<float>(payload + 4 * b, scale);
        for (size_t i = lo; i < lo + len; i++) {
          const int32_t q = std::clamp(round_product_half_even(sum[i], inv_scale), -qmax, qmax);
          codes[i] = (uint8_t)(int8_t)q;
        }
      }
      return true;
    }
  }
  return false;
}

}  // namespace

void outer_delta(float* delta, const float* base, const float* theta, size_t n) {
  for (size_t i = 0; i < n; i++) delta[i] = base[i] - theta[i];
}

void fold(float* theta, const float* global, const float* theta_at_send, FoldMode mode, float alpha, size_t n) {
  switch (mode) {
    case FoldMode::kOverwrite:
      for (size_t i = 0; i < n; i++) theta[i] = global[i];
      break;
    case FoldMode::kReplay:
      for (size_t i = 0; i < n; i++) theta[i] = global[i] + (theta[i] - theta_at_send[i]);
      break;
    case FoldMode::kMix:
      for (size_t i = 0; i < n; i++) theta[i] = alpha * theta[i] + (1.0f - alpha) * global[i];
      break;
  }
}

float sync_max_scale(int qmax) {
  float s = FLT_MAX / (float)qmax;
  while (!std::isfinite(s * (float)qmax)) s = std::nextafter(s, 0.0f);
  return s;
}

size_t sync_payload_bytes(SyncCodec kind, size_t n, int block) {
  switch (kind) {
    case SyncCodec::kFp32: return 4 * n;
    case SyncCodec::kBf16: return 2 * n;
    case SyncCodec::kInt8: return 4 * num_blocks(n, block) + n;
    case SyncCodec::kInt4: return 4 * num_blocks(n, block) + (n + 1) / 2;
  }
  return 0;
}

bool sync_encode(uint8_t* payload, float* residual, const float* delta, SyncCodec kind, int block, size_t n) {
  std::vector<float> sum(delta, delta + n);
  if (residual)
    for (size_t i = 0; i < n; i++) sum[i] = residual[i] + delta[i];
  if (!encode(payload, sum.data(), kind, block, n)) return false;
  if (residual) {
    std::vector<float> decoded(n);
    if (!sync_decode(decoded.data(), payload, kind, block, n)) return false;
    for (size_t i = 0; i < n; i++) residual[i] = sum[i] - decoded[i];
  }
  return true;
}

bool sync_decode(float* out, const uint8_t* payload, SyncCodec kind, int block, size_t n) {
  switch (kind) {
    case SyncCodec::kFp32:
      for (size_t i = 0; i < n; i++) {
        out[i] = load<float>(payload + 4 * i);
        if ((float_bits(out[i]) & kAbsMask) >= kInfBits) return false;
      }
      return true;
    case SyncCodec::kBf16:
      for (size_t i = 0; i < n; i++) {
        const uint16_t h = load<uint16_t>(payload + 2 * i);
        if ((h & 0x7fffu) >= 0x7f80u) return false;
        out[i] = std::bit_cast<float>((uint32_t)h << 16);
      }
      return true;
    case SyncCodec::kInt8:
    case SyncCodec::kInt4: {
      const bool int8 = kind == SyncCodec::kInt8;
      const uint32_t max_scale_bits = float_bits(int8 ? sync_max_scale(127) : FLT_MAX);
      const size_t nb = num_blocks(n, block);
      const uint8_t* codes = payload + 4 * nb;
      if (!int8 && n % 2 != 0 && (codes[n / 2] >> 4) != 0) return false;  // pad nibble
      for (size_t b = 0; b < nb; b++) {
        const uint32_t sbits = load<uint32_t>(payload + 4 * b);
        if (sbits > max_scale_bits) return false;  // negative, NaN, Inf or too large
        const float scale = std::bit_cast<float>(sbits);
        const size_t lo = b * block, len = std::min<size_t>(block, n - lo);
        for (size_t i = lo; i < lo + len; i++) {
          if (int8) {
            const int q = (int8_t)codes[i];
            if (q < -127) return false;
            out[i] = (float)q * scale;
          } else {
            out[i] = kInt4Levels[(codes[i / 2] >> (4 * (i % 2))) & 15] * scale;
          }
        }
      }
      return true;
    }
  }
  return false;
}

}  // namespace diloco
