// Bias gradient: column sums of dout (CPU: the dbias loop of
// kernels/cpu/matmul.cpp). Two passes, no atomics: blocks of rows write
// partial sums, then one thread per column adds them in block order.
#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

constexpr int kRowsPerBlock = 64;
constexpr int kColsPerBlock = 128;

// grid (row chunks, column chunks).
__global__ void bias_partial_kernel(float* scratch, const nv_bf16* dout, int N, int OC) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const int row0 = blockIdx.x * kRowsPerBlock;
  const int row1 = min(N, row0 + kRowsPerBlock);
  float sum = 0.0f;
  for (int n = row0; n < row1; n++) sum += to_f(dout[(size_t)n * OC + c]);
  scratch[(size_t)blockIdx.x * OC + c] = sum;
}

__global__ void bias_reduce_kernel(float* dbias, const float* scratch, int chunks, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float sum = 0.0f;
  for (int k = 0; k < chunks; k++) sum += scratch[(size_t)k * OC + c];
  dbias[c] += sum;
}

__global__ void add_bias_kernel(nv_bf16* out, const nv_bf16* bias, int OC, size_t total) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
    out[i] = to_bf(to_f(out[i]) + to_f(bias[i % OC]));
}

}  // namespace

void add_bias(bf16* out, const bf16* bias, int N, int OC, Stream stream) {
  const size_t total = (size_t)N * OC;
  if (total == 0) return;
  add_bias_kernel<<<grid_for(total, 256), 256, 0, as_cuda(stream)>>>(as_nv(out), as_nv(bias), OC, total);
  CUDA_CHECK_LAUNCH();
}

size_t bias_backward_scratch_floats(int N, int OC) { return (size_t)ceil_div(N, kRowsPerBlock) * OC; }

void bias_backward(float* dbias, float* scratch, const bf16* dout, int N, int OC, Stream stream) {
  if (N == 0 || OC == 0) return;
  const unsigned chunks = ceil_div(N, kRowsPerBlock);
  bias_partial_kernel<<<dim3(chunks, ceil_div(OC, kColsPerBlock)), kColsPerBlock, 0, as_cuda(stream)>>>(
      scratch, as_nv(dout), N, OC);
  CUDA_CHECK_LAUNCH();
  bias_reduce_kernel<<<ceil_div(OC, 128), 128, 0, as_cuda(stream)>>>(dbias, scratch, (int)chunks, OC);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
