// Shared by the .cu files of the CUDA backend (never included outside
// kernels/cuda): error checks, bf16 conversions, warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/ops.h"

// Device and driver failures are invariant failures here: the learner cannot
// continue on a broken device, so report where and abort (on in release).
#define CUDA_CHECK(expr)                                                         \
  do {                                                                           \
    const cudaError_t err_ = (expr);                                             \
    if (err_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s:%d: CUDA error %s: %s (in %s)\n", __FILE__,       \
                   __LINE__, cudaGetErrorName(err_), cudaGetErrorString(err_),   \
                   #expr);                                                       \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

// After a kernel launch: catches bad launch configurations at once.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace diloco::cuda {

using nv_bf16 = __nv_bfloat16;

// The host-side API passes bf16 tensors as uint16_t (bf16 bits); kernels
// see them as __nv_bfloat16. Same size and bits.
static_assert(sizeof(nv_bf16) == sizeof(bf16));
inline nv_bf16* as_nv(bf16* p) { return reinterpret_cast<nv_bf16*>(p); }
inline const nv_bf16* as_nv(const bf16* p) { return reinterpret_cast<const nv_bf16*>(p); }
inline cudaStream_t as_cuda(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

__device__ __forceinline__ float to_f(nv_bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ nv_bf16 to_bf(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. The order is fixed by the launch shape, so the
// result is deterministic. `shared` holds at least 32 values.
template <typename F>
__device__ F block_sum(F v, F* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : F(0);
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// Enough blocks to fill the device a few times over for grid-stride loops,
// without depending on the device (launch shapes must not change results).
inline unsigned grid_for(size_t n, int threads, unsigned max_blocks = 8192) {
  const size_t blocks = (n + threads - 1) / threads;
  return (unsigned)(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

}  // namespace diloco::cuda
