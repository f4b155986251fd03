// Fused classifier: softmax + cross-entropy + its gradient (CPU:
// kernels/cpu/crossentropy.cpp). One block per row: one pass over the
// logits for the running max and sum (online softmax), one pass that writes
// the gradient over the logits. The probabilities are never stored.
#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

constexpr int kThreads = 512;

union Pack8 {
  uint4 u;
  nv_bf16 h[8];
};

// Running (max, sum of exp(x - max)).
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
__device__ __forceinline__ MaxSum add_value(MaxSum a, float x) {
  if (x > a.m) return {x, a.s * __expf(a.m - x) + 1.0f};
  return {a.m, a.s + __expf(x - a.m)};
}

__global__ void classifier_kernel(nv_bf16* dlogits, float* losses, const nv_bf16* logits, const int* targets,
                                  float dloss, int V, bool vec) {
  __shared__ float shared_m[32], shared_s[32];
  __shared__ float target_logit;
  const size_t row = blockIdx.x;
  const nv_bf16* x = logits + row * V;
  const int target = targets[row];
  if (threadIdx.x == 0) target_logit = to_f(x[target]);  // before any write (in place)
  MaxSum ms{-INFINITY, 0.0f};
  if (vec) {
    for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
      Pack8 p;
      p.u = reinterpret_cast<const uint4*>(x)[j];
#pragma unroll
      for (int k = 0; k < 8; k++) ms = add_value(ms, to_f(p.h[k]));
    }
  } else {
    for (int v = threadIdx.x; v < V; v += blockDim.x) ms = add_value(ms, to_f(x[v]));
  }
  // Block reduce of (max, sum): warps, then warp 0 over the warps.
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, ms.m, o), __shfl_xor_sync(0xffffffffu, ms.s, o)};
    ms = combine(ms, other);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) {
    shared_m[warp] = ms.m;
    shared_s[warp] = ms.s;
  }
  __syncthreads();
  ms = lane < warps ? MaxSum{shared_m[lane], shared_s[lane]} : MaxSum{-INFINITY, 0.0f};
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, ms.m, o), __shfl_xor_sync(0xffffffffu, ms.s, o)};
    ms = combine(ms, other);
  }
  const float maxv = ms.m, sum = ms.s;
  if (threadIdx.x == 0) losses[row] = logf(sum) + maxv - target_logit;
  if (!dlogits) return;
  const float inv = 1.0f / sum;
  nv_bf16* d = dlogits + row * V;
  if (vec) {
    for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
      Pack8 p, q;
      p.u = reinterpret_cast<const uint4*>(x)[j];
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const int v = j * 8 + k;
        const float prob = __expf(to_f(p.h[k]) - maxv) * inv;
        q.h[k] = to_bf((prob - (v == target ? 1.0f : 0.0f)) * dloss);
      }
      reinterpret_cast<uint4*>(d)[j] = q.u;
    }
  } else {
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
      const float prob = __expf(to_f(x[v]) - maxv) * inv;
      d[v] = to_bf((prob - (v == target ? 1.0f : 0.0f)) * dloss);
    }
  }
}

__global__ void mean_reduce_kernel(float* out, const float* x, int n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = (float)(s / n);
}

}  // namespace

void classifier_forward_backward(bf16* dlogits, float* losses, const bf16* logits, const int* targets,
                                 float dloss, int N, int V, Stream stream) {
  if (N == 0) return;
  const bool vec = V % 8 == 0 && (reinterpret_cast<uintptr_t>(logits) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(dlogits) & 15) == 0;
  classifier_kernel<<<N, kThreads, 0, as_cuda(stream)>>>(as_nv(dlogits), losses, as_nv(logits), targets, dloss, V,
                                                         vec);
  CUDA_CHECK_LAUNCH();
}

void mean_reduce(float* out, const float* x, int n, Stream stream) {
  mean_reduce_kernel<<<1, 1024, 0, as_cuda(stream)>>>(out, x, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
