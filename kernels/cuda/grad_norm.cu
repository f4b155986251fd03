// Global gradient norm (CPU: kernels/cpu/grad_clip.cpp): the same fixed
// chunks as the CPU, summed in double; partial sums per chunk, then one
// block adds them in a fixed order. No atomics: the same bits every run.
#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

__global__ void norm_partial_kernel(double* partial, const float* x, size_t n) {
  __shared__ double shared[32];
  const size_t begin = blockIdx.x * kNormChunk;
  const size_t end = begin + kNormChunk < n ? begin + kNormChunk : n;
  double s = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void norm_final_kernel(double* out, const double* partial, int chunks) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = s;
}

__global__ void scale_kernel(float* x, float scale, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] *= scale;
}

}  // namespace

size_t global_norm_scratch_doubles(size_t n) { return n == 0 ? 1 : (n + kNormChunk - 1) / kNormChunk; }

void global_norm_chunk_sums(double* partial, const float* x, size_t n, Stream stream) {
  const size_t chunks = (n + kNormChunk - 1) / kNormChunk;
  if (chunks == 0) return;
  norm_partial_kernel<<<(unsigned)chunks, 256, 0, as_cuda(stream)>>>(partial, x, n);
  CUDA_CHECK_LAUNCH();
}

void global_norm_of_chunk_sums(double* out, const double* partial, size_t chunks, Stream stream) {
  norm_final_kernel<<<1, 1024, 0, as_cuda(stream)>>>(out, partial, (int)chunks);
  CUDA_CHECK_LAUNCH();
}

void global_norm_squared(double* out, double* scratch, const float* x, size_t n, Stream stream) {
  global_norm_chunk_sums(scratch, x, n, stream);
  global_norm_of_chunk_sums(out, scratch, (n + kNormChunk - 1) / kNormChunk, stream);
}

void scale_inplace(float* x, float scale, size_t n, Stream stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n, 256), 256, 0, as_cuda(stream)>>>(x, scale, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
