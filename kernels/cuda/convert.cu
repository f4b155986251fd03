// fp32 <-> bf16 conversions. CPU equivalent: the round-to-nearest-even of
// the bf16 codec (kernels/cpu/sync_ops.cpp).
#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

__global__ void float_to_bf16_kernel(nv_bf16* out, const float* in, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = to_bf(in[i]);
}

__global__ void bf16_to_float_kernel(float* out, const nv_bf16* in, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = to_f(in[i]);
}

}  // namespace

void float_to_bf16(bf16* out, const float* in, size_t n, Stream stream) {
  if (n == 0) return;
  float_to_bf16_kernel<<<grid_for(n, 256), 256, 0, as_cuda(stream)>>>(as_nv(out), in, n);
  CUDA_CHECK_LAUNCH();
}

void bf16_to_float(float* out, const bf16* in, size_t n, Stream stream) {
  if (n == 0) return;
  bf16_to_float_kernel<<<grid_for(n, 256), 256, 0, as_cuda(stream)>>>(out, as_nv(in), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
