// Sync-path ops on the device: outer delta, fold, and the dense wire codecs
// with error feedback. kernels/sync_ops.h states the arithmetic and
// kernels/cpu/sync_ops.cpp is the reference: the payloads, residuals, decoded
// values and folds here are byte-identical to it (tests/kernels/test_cuda_ops.cpp).
// Every rounding step is an explicit _rn intrinsic, so nvcc cannot contract
// a multiply and an add into an FMA the rule does not have (or split one it
// has): the int8 code is __fmaf_rn(x, inv, 1.5 * 2^23), the round-half-even of
// the exact product, and the mix fold is __fmaf_rn(a, theta, b * global).
// Codec kernels: one warp per codec block, a grid-stride loop over blocks.
#include <cfloat>
#include <cmath>

#include "kernels/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/sync_ops.h"

namespace diloco::cuda {

namespace {

constexpr int kFp32 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4;
static_assert(kFp32 == (int)SyncCodec::kFp32 && kBf16 == (int)SyncCodec::kBf16 && kInt8 == (int)SyncCodec::kInt8 &&
              kInt4 == (int)SyncCodec::kInt4);
static_assert((int)FoldMode::kOverwrite == 0 && (int)FoldMode::kReplay == 1 && (int)FoldMode::kMix == 2);
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr int kThreads = 256;

__global__ void outer_delta_kernel(float* delta, const float* base, const float* theta, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    delta[i] = __fsub_rn(base[i], theta[i]);
}

__global__ void add_difference_kernel(float* x, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = __fadd_rn(x[i], b ? __fsub_rn(a[i], b[i]) : a[i]);
}

// mix: a = fl32(alpha), b = fl32(1 - alpha) from the host (kernels/sync_ops.h).
__global__ void fold_kernel(float* theta, const float* global, const float* theta_at_send, int mode, float a, float b,
                            size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    if (mode == 0) {
      theta[i] = global[i];
    } else if (mode == 1) {
      theta[i] = __fadd_rn(global[i], __fsub_rn(theta[i], theta_at_send[i]));
    } else {
      theta[i] = __fmaf_rn(a, theta[i], __fmul_rn(b, global[i]));
    }
  }
}

__device__ __forceinline__ float sum_at(const float* delta, const float* residual, size_t i) {
  return residual ? __fadd_rn(residual[i], delta[i]) : delta[i];
}

// round-half-even of the EXACT product x * inv_scale: one rounding of
// x * inv_scale + 1.5 * 2^23 leaves the integer in the low mantissa bits
// (|x * inv_scale| <= 127 * (1 + 2^-23) < 2^22). The CPU computes the same
// integer from the product in double (kernels/sync_ops.h).
__device__ __forceinline__ int code_of(float x, float inv_scale, int qm) {
  const int q = __float_as_int(__fmaf_rn(x, inv_scale, 12582912.0f)) - 0x4b400000;
  return min(max(q, -qm), qm);
}

// int4: code c decodes to kInt4Levels[c] * scale, scale = the block's absmax;
// the table is kernels/sync_ops.h's kSyncInt4Levels, copied to constant memory.
__constant__ float kInt4Levels[16] = {
    kSyncInt4Levels[0],  kSyncInt4Levels[1],  kSyncInt4Levels[2],  kSyncInt4Levels[3],
    kSyncInt4Levels[4],  kSyncInt4Levels[5],  kSyncInt4Levels[6],  kSyncInt4Levels[7],
    kSyncInt4Levels[8],  kSyncInt4Levels[9],  kSyncInt4Levels[10], kSyncInt4Levels[11],
    kSyncInt4Levels[12], kSyncInt4Levels[13], kSyncInt4Levels[14], kSyncInt4Levels[15]};

// The nearest level to v = fl(x * (1 / absmax)): m = how many of the 7 positive
// midpoints fl(0.5 * fl(L[8+k] + L[9+k])) |v| exceeds; a value on a midpoint
// takes the level nearer to zero; -0 takes level 8.
__device__ __forceinline__ int int4_code(float v) {
  int m = 0;
  for (int k = 0; k < 7; k++)
    m += fabsf(v) > __fmul_rn(0.5f, __fadd_rn(kInt4Levels[8 + k], kInt4Levels[9 + k]));
  return v < 0.0f ? 7 - m : 8 + m;
}

// bf16: round-to-nearest-even on the bits (an integer computation).
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const uint32_t b = __float_as_uint(x);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// Elementwise codecs (fp32, bf16): payload and the bad flag.
__global__ void encode_elementwise_kernel(uint8_t* payload, int* bad, const float* delta, const float* residual,
                                          int kind, size_t n) {
  bool ok = true;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float s = sum_at(delta, residual, i);
    ok &= (__float_as_uint(s) & kAbsMask) < kInfBits;
    if (kind == kFp32) {
      reinterpret_cast<float*>(payload)[i] = s;
    } else {
      const uint16_t r = bf16_bits(s);
      ok &= (r & 0x7fffu) < 0x7f80u;
      reinterpret_cast<uint16_t*>(payload)[i] = r;
    }
  }
  if (!ok) *bad = 1;  // every writer writes the same value: no race on the result
}

// Block codecs (int8, int4): one warp per codec block.
__global__ void encode_blocks_kernel(uint8_t* payload, int* bad, const float* delta, const float* residual,
                                     int kind, int block, size_t n, float max_scale) {
  const int lane = threadIdx.x % 32;
  const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
  const size_t nb = (n + block - 1) / block;
  const bool int8 = kind == kInt8;
  const float qmax = int8 ? 127.0f : 7.0f;
  const int qm = int8 ? 127 : 7;
  float* scales = reinterpret_cast<float*>(payload);
  uint8_t* codes = payload + 4 * nb;
  for (size_t b = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; b < nb; b += warps) {
    const size_t lo = b * (size_t)block;
    const int len = (int)(n - lo < (size_t)block ? n - lo : (size_t)block);
    uint32_t amax_bits = 0;
    for (int j = lane; j < len; j += 32) amax_bits = max(amax_bits, __float_as_uint(sum_at(delta, residual, lo + j)) & kAbsMask);
    amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
    if (amax_bits >= kInfBits) {
      if (lane == 0) *bad = 1;
      continue;
    }
    const float amax = __uint_as_float(amax_bits);
    float inv_scale = __fdiv_rn(qmax, amax);  // Inf for an all-zero block
    float scale = fminf(__fdiv_rn(amax, qmax), max_scale);
    if (!int8) {  // int4: scale = absmax, codes from the level table
      inv_scale = __fdiv_rn(1.0f, amax);
      scale = amax;
      if (!(__fdiv_rn(127.0f, amax) <= FLT_MAX)) inv_scale = scale = 0.0f;
    }
    if (!(inv_scale <= FLT_MAX)) inv_scale = scale = 0.0f;
    if (lane == 0) scales[b] = scale;
    if (int8) {
      for (int j = lane; j < len; j += 32) {
        const int q = code_of(sum_at(delta, residual, lo + j), inv_scale, qm);
        codes[lo + j] = (uint8_t)(int8_t)q;
      }
    } else {
      // lo is even (block is even), so byte lo/2 + p holds values lo+2p, lo+2p+1.
      for (int p = lane; p < (len + 1) / 2; p += 32) {
        const size_t i = lo + 2 * (size_t)p;
        const int a = int4_code(__fmul_rn(sum_at(delta, residual, i), inv_scale));
        int c = 0;  // the pad nibble of an odd last value stays 0
        if (2 * p + 1 < len) c = int4_code(__fmul_rn(sum_at(delta, residual, i + 1), inv_scale));
        codes[i / 2] = (uint8_t)((a & 15) | ((c & 15) << 4));
      }
    }
  }
}

__device__ __forceinline__ float decode_at(const uint8_t* payload, int kind, int block, size_t nb, size_t i,
                                           uint32_t max_scale_bits, bool* ok) {
  if (kind == kFp32) {
    const float v = reinterpret_cast<const float*>(payload)[i];
    *ok &= (__float_as_uint(v) & kAbsMask) < kInfBits;
    return v;
  }
  if (kind == kBf16) {
    const uint16_t h = reinterpret_cast<const uint16_t*>(payload)[i];
    *ok &= (h & 0x7fffu) < 0x7f80u;
    return __uint_as_float((uint32_t)h << 16);
  }
  const uint32_t sbits = reinterpret_cast<const uint32_t*>(payload)[i / block];
  *ok &= sbits <= max_scale_bits;
  const float scale = __uint_as_float(sbits);
  const uint8_t* codes = payload + 4 * nb;
  if (kind == kInt8) {
    const int q = (int8_t)codes[i];
    *ok &= q >= -127;
    return __fmul_rn((float)q, scale);
  }
  return __fmul_rn(kInt4Levels[(codes[i / 2] >> (4 * (i % 2))) & 15], scale);
}

__global__ void decode_kernel(float* out, int* bad, const uint8_t* payload, int kind, int block, size_t n,
                              uint32_t max_scale_bits) {
  const size_t nb = (kind == kInt8 || kind == kInt4) ? (n + block - 1) / block : 0;
  bool ok = true;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = decode_at(payload, kind, block, nb, i, max_scale_bits, &ok);
  if (kind == kInt4 && n % 2 == 1 && blockIdx.x == 0 && threadIdx.x == 0)
    ok &= (payload[4 * nb + n / 2] >> 4) == 0;
  if (!ok) *bad = 1;
}

// residual = sum - Decode(payload), unless the encode flagged the input.
__global__ void feedback_kernel(float* residual, const int* bad, const float* delta, const uint8_t* payload,
                                int kind, int block, size_t n) {
  if (*bad) return;
  const size_t nb = (kind == kInt8 || kind == kInt4) ? (n + block - 1) / block : 0;
  bool ok = true;  // the payload was just written by the encoder: always valid
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float s = __fadd_rn(residual[i], delta[i]);
    residual[i] = __fsub_rn(s, decode_at(payload, kind, block, nb, i, 0xffffffffu, &ok));
  }
}

void check_codec_args(const void* payload, int kind, int block) {
  DL_CHECK(kind >= kFp32 && kind <= kInt4, "sync codec kind %d: use 1 fp32, 2 bf16, 3 int8 or 4 int4", kind);
  DL_CHECK((kind != kInt8 && kind != kInt4) || (block >= 2 && block % 2 == 0),
           "sync codec block %d must be even and >= 2", block);
  DL_CHECK((reinterpret_cast<uintptr_t>(payload) & 3) == 0, "sync codec payload must be 4-byte aligned");
}

}  // namespace

void outer_delta(float* delta, const float* base, const float* theta, size_t n, Stream stream) {
  if (n == 0) return;
  outer_delta_kernel<<<grid_for(n, kThreads), kThreads, 0, as_cuda(stream)>>>(delta, base, theta, n);
  CUDA_CHECK_LAUNCH();
}

void fold(float* theta, const float* global, const float* theta_at_send, int mode, double alpha, size_t n,
          Stream stream) {
  DL_CHECK(mode >= 0 && mode <= 2, "fold mode %d", mode);
  if (n == 0) return;
  // a and b exactly as the CPU fold computes them from the double alpha.
  const float a = (float)alpha, b = (float)(1.0 - alpha);
  fold_kernel<<<grid_for(n, kThreads), kThreads, 0, as_cuda(stream)>>>(theta, global, theta_at_send, mode, a, b,
                                                                       n);
  CUDA_CHECK_LAUNCH();
}

void add_difference(float* x, const float* a, const float* b, size_t n, Stream stream) {
  if (n == 0) return;
  add_difference_kernel<<<grid_for(n, kThreads), kThreads, 0, as_cuda(stream)>>>(x, a, b, n);
  CUDA_CHECK_LAUNCH();
}

size_t sync_payload_bytes(int kind, size_t n, int block) {
  if (kind < kFp32 || kind > kInt4 || ((kind == kInt8 || kind == kInt4) && block < 1)) return 0;
  return diloco::sync_payload_bytes(static_cast<SyncCodec>(kind), n, block);
}

void sync_encode(uint8_t* payload, float* residual, int* bad, const float* delta, int kind, int block, size_t n,
                 Stream stream) {
  check_codec_args(payload, kind, block);
  cudaStream_t s = as_cuda(stream);
  CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), s));
  if (n == 0) return;
  if (kind == kFp32 || kind == kBf16) {
    encode_elementwise_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(payload, bad, delta, residual, kind, n);
  } else {
    const size_t nb = (n + block - 1) / block;
    encode_blocks_kernel<<<grid_for(nb * 32, kThreads), kThreads, 0, s>>>(
        payload, bad, delta, residual, kind, block, n, sync_max_scale(kind == kInt8 ? 127 : 7));
  }
  CUDA_CHECK_LAUNCH();
  if (residual) {
    feedback_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(residual, bad, delta, payload, kind, block, n);
    CUDA_CHECK_LAUNCH();
  }
}

void sync_decode(float* out, int* bad, const uint8_t* payload, int kind, int block, size_t n, Stream stream) {
  check_codec_args(payload, kind, block);
  cudaStream_t s = as_cuda(stream);
  CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), s));
  if (n == 0) return;
  const uint32_t max_scale_bits = __builtin_bit_cast(uint32_t, kind == kInt8 ? sync_max_scale(127) : FLT_MAX);
  decode_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, bad, payload, kind, block, n, max_scale_bits);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
