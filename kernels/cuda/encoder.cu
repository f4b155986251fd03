// Token + position embedding (CPU: kernels/cpu/encoder.cpp).
// Backward without atomics: the host groups positions by token
// (build_token_buckets), then one thread per (bucket, channel) sums its
// positions in ascending order.
#include <algorithm>
#include <numeric>

#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

__global__ void encoder_forward_kernel(nv_bf16* out, const int* tokens, const nv_bf16* wte, const nv_bf16* wpe,
                                       int T, int C, size_t total) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += stride) {
    const size_t pos = i / C;
    const int c = (int)(i % C);
    const int t = (int)(pos % T);
    out[i] = to_bf(to_f(wte[(size_t)tokens[pos] * C + c]) + to_f(wpe[(size_t)t * C + c]));
  }
}

// C % 8 == 0 and 16-byte aligned tensors: one thread per 8 channels.
__global__ void encoder_forward_vec_kernel(uint4* out, const int* tokens, const uint4* wte, const uint4* wpe, int T,
                                           int C8, size_t total8) {
  union Pack8 {
    uint4 u;
    nv_bf16 h[8];
  };
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total8; i += stride) {
    const size_t pos = i / C8;
    const int c8 = (int)(i % C8);
    const int t = (int)(pos % T);
    Pack8 we, pe, o;
    we.u = wte[(size_t)tokens[pos] * C8 + c8];
    pe.u = wpe[(size_t)t * C8 + c8];
#pragma unroll
    for (int k = 0; k < 8; k++) o.h[k] = to_bf(to_f(we.h[k]) + to_f(pe.h[k]));
    out[i] = o.u;
  }
}

// grid (num_buckets, ceil(C / blockDim.x)): thread c of bucket k.
__global__ void encoder_backward_wte_kernel(float* dwte, const nv_bf16* dout, const int* order,
                                            const int* bucket_start, const int* bucket_token, int C) {
  const int k = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int begin = bucket_start[k], end = bucket_start[k + 1];
  float sum = 0.0f;
  for (int j = begin; j < end; j++) sum += to_f(dout[(size_t)order[j] * C + c]);
  dwte[(size_t)bucket_token[k] * C + c] += sum;
}

// One thread per (t, c), summing over b in order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const nv_bf16* dout, int B, int T, int C) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)T * C) return;
  float sum = 0.0f;
  for (int b = 0; b < B; b++) sum += to_f(dout[(size_t)b * T * C + i]);
  dwpe[i] += sum;
}

}  // namespace

void encoder_forward(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     Stream stream) {
  const size_t total = (size_t)B * T * C;
  if (total == 0) return;
  const auto al16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (C % 8 == 0 && al16(out) && al16(wte) && al16(wpe)) {
    encoder_forward_vec_kernel<<<grid_for(total / 8, 256), 256, 0, as_cuda(stream)>>>(
        reinterpret_cast<uint4*>(out), tokens, reinterpret_cast<const uint4*>(wte),
        reinterpret_cast<const uint4*>(wpe), T, C / 8, total / 8);
  } else {
    encoder_forward_kernel<<<grid_for(total, 256), 256, 0, as_cuda(stream)>>>(as_nv(out), tokens, as_nv(wte),
                                                                             as_nv(wpe), T, C, total);
  }
  CUDA_CHECK_LAUNCH();
}

TokenBuckets build_token_buckets(const int* tokens, int N) {
  TokenBuckets b;
  b.order.resize(N);
  std::iota(b.order.begin(), b.order.end(), 0);
  // Stable: positions stay ascending within a token, fixing the sum order.
  std::stable_sort(b.order.begin(), b.order.end(), [&](int x, int y) { return tokens[x] < tokens[y]; });
  for (int j = 0; j < N; j++) {
    if (j == 0 || tokens[b.order[j]] != tokens[b.order[j - 1]]) {
      b.bucket_start.push_back(j);
      b.bucket_token.push_back(tokens[b.order[j]]);
    }
  }
  b.bucket_start.push_back(N);
  return b;
}

void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const int* order, const int* bucket_start,
                      const int* bucket_token, int num_buckets, int B, int T, int C, Stream stream) {
  if (num_buckets > 0) {
    const dim3 grid(num_buckets, ceil_div(C, 128));
    encoder_backward_wte_kernel<<<grid, 128, 0, as_cuda(stream)>>>(dwte, as_nv(dout), order, bucket_start,
                                                                 bucket_token, C);
    CUDA_CHECK_LAUNCH();
  }
  const size_t tc = (size_t)T * C;
  if (tc > 0) {
    encoder_backward_wpe_kernel<<<ceil_div(tc, 256), 256, 0, as_cuda(stream)>>>(dwpe, as_nv(dout), B, T, C);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace diloco::cuda
