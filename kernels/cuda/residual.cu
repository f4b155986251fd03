// Residual add (CPU: kernels/cpu/residual.cpp). The model fuses it into
// layernorm_forward; this standalone op is for tests and other callers.
#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

__global__ void residual_forward_kernel(nv_bf16* out, const nv_bf16* a, const nv_bf16* b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = to_bf(to_f(a[i]) + to_f(b[i]));
}

}  // namespace

void residual_forward(bf16* out, const bf16* a, const bf16* b, size_t n, Stream stream) {
  if (n == 0) return;
  residual_forward_kernel<<<grid_for(n, 256), 256, 0, as_cuda(stream)>>>(as_nv(out), as_nv(a), as_nv(b), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
