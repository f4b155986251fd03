// LayerNorm fused with the residual add (CPU: kernels/cpu/layernorm.cpp and
// kernels/cpu/residual.cpp). Forward: one warp per row; the row is cached in
// shared memory in fp32, so global memory is read once and written once
// (16-byte accesses when C % 8 == 0 and the pointers allow).
#include "kernels/check.h"
#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

constexpr float kEps = 1e-5f;
constexpr int kMaxSharedBytes = 48 * 1024;  // no opt-in needed
constexpr int kBackwardRowsPerBlock = 32;

int rows_per_block(int C) {
  int rows = kMaxSharedBytes / (C * (int)sizeof(float));
  return rows > 8 ? 8 : rows;
}

// 8 bf16 in one 16-byte word.
union Pack8 {
  uint4 u;
  nv_bf16 h[8];
};

// vec: C % 8 == 0 and every pointer 16-byte aligned: 16-byte loads and stores.
__global__ void layernorm_forward_kernel(nv_bf16* res_out, nv_bf16* out, float* mean, float* rstd,
                                         const nv_bf16* a, const nv_bf16* b, const nv_bf16* weight,
                                         const nv_bf16* bias, int N, int C, bool vec) {
  extern __shared__ float rows[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + warp;
  if (n >= N) return;
  float* x = rows + (size_t)warp * C;
  const size_t base = (size_t)n * C;
  float sum = 0.0f;
  if (vec) {
    for (int j = lane; j < C / 8; j += 32) {
      Pack8 pa, pb, r;
      pa.u = reinterpret_cast<const uint4*>(a + base)[j];
      if (b) pb.u = reinterpret_cast<const uint4*>(b + base)[j];
#pragma unroll
      for (int k = 0; k < 8; k++) {
        float v = to_f(pa.h[k]);
        if (b) {
          r.h[k] = to_bf(v + to_f(pb.h[k]));
          v = to_f(r.h[k]);  // normalise what backward will read back
        }
        x[8 * j + k] = v;
        sum += v;
      }
      if (b) reinterpret_cast<uint4*>(res_out + base)[j] = r.u;
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      float v;
      if (b) {
        const nv_bf16 r = to_bf(to_f(a[base + c]) + to_f(b[base + c]));
        res_out[base + c] = r;
        v = to_f(r);
      } else {
        v = to_f(a[base + c]);
      }
      x[c] = v;
      sum += v;
    }
  }
  __syncwarp();
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    var += d * d;
  }
  var = warp_sum(var) / C;
  const float s = rsqrtf(var + kEps);
  if (vec) {
    for (int j = lane; j < C / 8; j += 32) {
      Pack8 pw, pbias, o;
      pw.u = reinterpret_cast<const uint4*>(weight)[j];
      pbias.u = reinterpret_cast<const uint4*>(bias)[j];
#pragma unroll
      for (int k = 0; k < 8; k++) o.h[k] = to_bf((x[8 * j + k] - m) * s * to_f(pw.h[k]) + to_f(pbias.h[k]));
      reinterpret_cast<uint4*>(out + base)[j] = o.u;
    }
  } else {
    for (int c = lane; c < C; c += 32)
      out[base + c] = to_bf((x[c] - m) * s * to_f(weight[c]) + to_f(bias[c]));
  }
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Block: kBackwardRowsPerBlock rows. Warps compute dinp row by row; then
// each thread owns channels and sums its rows' parameter gradients in row
// order into scratch[block] = [dweight (C) | dbias (C)].
__global__ void layernorm_backward_kernel(nv_bf16* dinp, float* scratch, const nv_bf16* dout, const nv_bf16* inp,
                                          const nv_bf16* weight, const float* mean, const float* rstd, int N,
                                          int C, bool accumulate) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int row0 = blockIdx.x * kBackwardRowsPerBlock;
  const int row1 = min(N, row0 + kBackwardRowsPerBlock);
  for (int n = row0 + warp; n < row1; n += warps) {
    const size_t base = (size_t)n * C;
    const float m = mean[n], s = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float dnorm = to_f(weight[c]) * to_f(dout[base + c]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (to_f(inp[base + c]) - m) * s;
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    for (int c = lane; c < C; c += 32) {
      const float norm = (to_f(inp[base + c]) - m) * s;
      const float dnorm = to_f(weight[c]) * to_f(dout[base + c]);
      float dx = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      if (accumulate) dx += to_f(dinp[base + c]);
      dinp[base + c] = to_bf(dx);
    }
  }
  float* part = scratch + (size_t)blockIdx.x * 2 * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float dw = 0.0f, db = 0.0f;
    for (int n = row0; n < row1; n++) {
      const size_t i = (size_t)n * C + c;
      const float d = to_f(dout[i]);
      db += d;
      dw += (to_f(inp[i]) - mean[n]) * rstd[n] * d;
    }
    part[c] = dw;
    part[C + c] = db;
  }
}

// dweight[c] += sum over blocks of scratch[block][c]. A block owns 32
// channels; its 32 x 32 threads each sum every 32nd partial of one channel,
// then the 32 sums of a channel are added in a fixed order: deterministic,
// and thousands of partials cost a few loads per thread instead of one
// thread walking all of them.
constexpr int kReduceLanes = 32;
__global__ void layernorm_param_reduce_kernel(float* dweight, float* dbias, const float* scratch, int blocks,
                                              int C) {
  __shared__ float sw[kReduceLanes][kReduceLanes + 1], sb[kReduceLanes][kReduceLanes + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kReduceLanes + tx;
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (int k = ty; k < blocks; k += kReduceLanes) {
      dw += scratch[(size_t)k * 2 * C + c];
      db += scratch[(size_t)k * 2 * C + C + c];
    }
  }
  sw[ty][tx] = dw;
  sb[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && c < C) {
    float w = 0.0f, b = 0.0f;
    for (int k = 0; k < kReduceLanes; k++) {
      w += sw[k][tx];
      b += sb[k][tx];
    }
    dweight[c] += w;
    dbias[c] += b;
  }
}

}  // namespace

void layernorm_forward(bf16* res_out, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                       const bf16* weight, const bf16* bias, int N, int C, Stream stream) {
  if (N == 0) return;
  const int rows = rows_per_block(C);
  DL_CHECK(rows >= 1, "layernorm: C = %d too large for one row in shared memory", C);
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(weight) && aligned16(bias) &&
                   (!b || (aligned16(b) && aligned16(res_out)));
  layernorm_forward_kernel<<<ceil_div(N, rows), rows * 32, (size_t)rows * C * sizeof(float), as_cuda(stream)>>>(
      as_nv(res_out), as_nv(out), mean, rstd, as_nv(a), as_nv(b), as_nv(weight), as_nv(bias), N, C, vec);
  CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_scratch_floats(int N, int C) {
  return (size_t)ceil_div(N, kBackwardRowsPerBlock) * 2 * C;
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                        const bf16* inp, const bf16* weight, const float* mean, const float* rstd, int N, int C,
                        bool accumulate, Stream stream) {
  if (N == 0) return;
  const unsigned blocks = ceil_div(N, kBackwardRowsPerBlock);
  layernorm_backward_kernel<<<blocks, 256, 0, as_cuda(stream)>>>(as_nv(dinp), scratch, as_nv(dout), as_nv(inp),
                                                                 as_nv(weight), mean, rstd, N, C, accumulate);
  CUDA_CHECK_LAUNCH();
  layernorm_param_reduce_kernel<<<ceil_div(C, kReduceLanes), dim3(kReduceLanes, kReduceLanes), 0,
                                  as_cuda(stream)>>>(dweight, dbias, scratch, (int)blocks, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
