// GELU, tanh approximation (CPU: kernels/cpu/gelu.cpp). bf16 in and out,
// fp32 math; 8 values (16 bytes) per load when the pointers allow it.
#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__device__ __forceinline__ float gelu_f(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float gelu_grad_f(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  const float th = tanhf(u);
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// 8 bf16 in one 16-byte word.
union Pack8 {
  uint4 u;
  nv_bf16 h[8];
};

__global__ void gelu_forward_kernel(nv_bf16* out, const nv_bf16* inp, size_t n, bool vec) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (vec) {
    const size_t n8 = n / 8;
    for (size_t j = i; j < n8; j += stride) {
      Pack8 x, y;
      x.u = reinterpret_cast<const uint4*>(inp)[j];
#pragma unroll
      for (int k = 0; k < 8; k++) y.h[k] = to_bf(gelu_f(to_f(x.h[k])));
      reinterpret_cast<uint4*>(out)[j] = y.u;
    }
    i += n8 * 8;  // the scalar tail
  }
  for (; i < n; i += stride) out[i] = to_bf(gelu_f(to_f(inp[i])));
}

__global__ void gelu_backward_kernel(nv_bf16* dinp, const nv_bf16* inp, const nv_bf16* dout, size_t n, bool vec) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (vec) {
    const size_t n8 = n / 8;
    for (size_t j = i; j < n8; j += stride) {
      Pack8 x, d, y;
      x.u = reinterpret_cast<const uint4*>(inp)[j];
      d.u = reinterpret_cast<const uint4*>(dout)[j];
#pragma unroll
      for (int k = 0; k < 8; k++) y.h[k] = to_bf(gelu_grad_f(to_f(x.h[k])) * to_f(d.h[k]));
      reinterpret_cast<uint4*>(dinp)[j] = y.u;
    }
    i += n8 * 8;
  }
  for (; i < n; i += stride) dinp[i] = to_bf(gelu_grad_f(to_f(inp[i])) * to_f(dout[i]));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, size_t n, Stream stream) {
  if (n == 0) return;
  const bool vec = aligned16(out) && aligned16(inp);
  gelu_forward_kernel<<<grid_for(vec ? n / 8 + 8 : n, 256), 256, 0, as_cuda(stream)>>>(as_nv(out), as_nv(inp), n,
                                                                                        vec);
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, size_t n, Stream stream) {
  if (n == 0) return;
  const bool vec = aligned16(dinp) && aligned16(inp) && aligned16(dout);
  gelu_backward_kernel<<<grid_for(vec ? n / 8 + 8 : n, 256), 256, 0, as_cuda(stream)>>>(
      as_nv(dinp), as_nv(inp), as_nv(dout), n, vec);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
