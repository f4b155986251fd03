// AdamW on fp32 master weights (CPU: kernels/cpu/adamw.cpp), writing the
// bf16 copy the forward and backward use in the same pass.
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

struct Coeffs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, c1, c2;
};

Coeffs coeffs_of(const AdamWArgs& a) {
  // Bias corrections in double on the host, as the CPU path computes them.
  return {a.lr,
          a.beta1,
          a.beta2,
          a.eps,
          a.weight_decay,
          a.grad_scale,
          1.0f - (float)std::pow((double)a.beta1, (double)a.step),
          1.0f - (float)std::pow((double)a.beta2, (double)a.step)};
}

__device__ __forceinline__ void adamw_element(float* params, nv_bf16* params_bf16, float* m, float* v,
                                              const float* grads, size_t i, const Coeffs& k, float wd) {
  const float g = grads[i] * k.grad_scale;
  const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
  const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float mhat = mi / k.c1;
  const float vhat = vi / k.c2;
  const float p = params[i] - k.lr * (mhat / (sqrtf(vhat) + k.eps) + wd * params[i]);
  params[i] = p;
  if (params_bf16) params_bf16[i] = to_bf(p);
}

__global__ void adamw_kernel(float* params, nv_bf16* params_bf16, float* m, float* v, const float* grads, size_t n,
                             Coeffs k) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    adamw_element(params, params_bf16, m, v, grads, i, k, k.weight_decay);
}

__global__ void adamw_chunks_kernel(float* params, nv_bf16* params_bf16, float* m, float* v, const float* grads,
                                    const AdamWChunk* chunks, Coeffs k) {
  const AdamWChunk c = chunks[blockIdx.x];
  const float wd = c.decay ? k.weight_decay : 0.0f;
  for (uint32_t j = threadIdx.x; j < c.numel; j += blockDim.x)
    adamw_element(params, params_bf16, m, v, grads, c.offset + j, k, wd);
}

}  // namespace

void adamw_update(float* params, bf16* params_bf16, float* m, float* v, const float* grads, size_t n,
                  const AdamWArgs& args, Stream stream) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n, 256), 256, 0, as_cuda(stream)>>>(params, as_nv(params_bf16), m, v, grads, n,
                                                              coeffs_of(args));
  CUDA_CHECK_LAUNCH();
}

void append_adamw_chunks(std::vector<AdamWChunk>* chunks, size_t offset, size_t numel, bool decay) {
  for (size_t done = 0; done < numel; done += kAdamWChunkElems) {
    const size_t len = numel - done < kAdamWChunkElems ? numel - done : kAdamWChunkElems;
    chunks->push_back({offset + done, (uint32_t)len, decay ? 1u : 0u});
  }
}

void adamw_update_chunks(float* params, bf16* params_bf16, float* m, float* v, const float* grads,
                         const AdamWChunk* chunks, int num_chunks, const AdamWArgs& args, Stream stream) {
  if (num_chunks == 0) return;
  adamw_chunks_kernel<<<num_chunks, 512, 0, as_cuda(stream)>>>(params, as_nv(params_bf16), m, v, grads, chunks,
                                                               coeffs_of(args));
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
