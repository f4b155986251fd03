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
constexpr int kBackwardRowsPerChunk = 256;  // rows per partial of dweight/dbias

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

// dinp, one warp per row (16-byte accesses when vec): two passes over the
// row, the second mostly from L1/L2.
__global__ void layernorm_backward_dinp_kernel(nv_bf16* dinp, const nv_bf16* dout, const nv_bf16* inp,
                                               const nv_bf16* weight, const float* mean, const float* rstd, int N,
                                               int C, bool accumulate, bool vec) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const size_t base = (size_t)n * C;
  const float m = mean[n], s = rstd[n];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  if (vec) {
    for (int j = lane; j < C / 8; j += 32) {
      Pack8 w, d, x;
      w.u = reinterpret_cast<const uint4*>(weight)[j];
      d.u = reinterpret_cast<const uint4*>(dout + base)[j];
      x.u = reinterpret_cast<const uint4*>(inp + base)[j];
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float dnorm = to_f(w.h[k]) * to_f(d.h[k]);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (to_f(x.h[k]) - m) * s;
      }
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float dnorm = to_f(weight[c]) * to_f(dout[base + c]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (to_f(inp[base + c]) - m) * s;
    }
  }
  dnorm_mean = warp_sum(dnorm_mean) / C;
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
  if (vec) {
    for (int j = lane; j < C / 8; j += 32) {
      Pack8 w, d, x, o, prev;
      w.u = reinterpret_cast<const uint4*>(weight)[j];
      d.u = reinterpret_cast<const uint4*>(dout + base)[j];
      x.u = reinterpret_cast<const uint4*>(inp + base)[j];
      if (accumulate) prev.u = reinterpret_cast<const uint4*>(dinp + base)[j];
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float norm = (to_f(x.h[k]) - m) * s;
        const float dnorm = to_f(w.h[k]) * to_f(d.h[k]);
        float dx = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        if (accumulate) dx += to_f(prev.h[k]);
        o.h[k] = to_bf(dx);
      }
      reinterpret_cast<uint4*>(dinp + base)[j] = o.u;
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float norm = (to_f(inp[base + c]) - m) * s;
      const float dnorm = to_f(weight[c]) * to_f(dout[base + c]);
      float dx = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      if (accumulate) dx += to_f(dinp[base + c]);
      dinp[base + c] = to_bf(dx);
    }
  }
}

// Parameter gradients of a chunk of kBackwardRowsPerChunk rows: block
// (32 channels) x (8 row lanes); each thread sums every 8th row of the
// chunk for its channel, then the 8 sums are added in a fixed order into
// scratch[chunk] = [dweight (C) | dbias (C)]. Coalesced across channels,
// and thousands of blocks keep the loads in flight.
constexpr int kParamChannels = 32, kParamRowLanes = 8;
__global__ void layernorm_backward_params_kernel(float* scratch, const nv_bf16* dout, const nv_bf16* inp,
                                                 const float* mean, const float* rstd, int N, int C) {
  __shared__ float sw[kParamRowLanes][kParamChannels], sb[kParamRowLanes][kParamChannels];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kParamChannels + tx, chunk = blockIdx.y;
  const int row0 = chunk * kBackwardRowsPerChunk, row1 = min(N, row0 + kBackwardRowsPerChunk);
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (int n = row0 + ty; n < row1; n += kParamRowLanes) {
      const size_t i = (size_t)n * C + c;
      const float d = to_f(dout[i]);
      db += d;
      dw += (to_f(inp[i]) - mean[n]) * rstd[n] * d;
    }
  }
  sw[ty][tx] = dw;
  sb[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && c < C) {
    float w = 0.0f, b = 0.0f;
    for (int k = 0; k < kParamRowLanes; k++) {
      w += sw[k][tx];
      b += sb[k][tx];
    }
    float* part = scratch + (size_t)chunk * 2 * C;
    part[c] = w;
    part[C + c] = b;
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
  return (size_t)ceil_div(N, kBackwardRowsPerChunk) * 2 * C;
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                        const bf16* inp, const bf16* weight, const float* mean, const float* rstd, int N, int C,
                        bool accumulate, Stream stream) {
  if (N == 0) return;
  const bool vec = C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight);
  constexpr int kRowsPerBlock = 8;  // warps
  layernorm_backward_dinp_kernel<<<ceil_div(N, kRowsPerBlock), kRowsPerBlock * 32, 0, as_cuda(stream)>>>(
      as_nv(dinp), as_nv(dout), as_nv(inp), as_nv(weight), mean, rstd, N, C, accumulate, vec);
  CUDA_CHECK_LAUNCH();
  const unsigned chunks = ceil_div(N, kBackwardRowsPerChunk);
  layernorm_backward_params_kernel<<<dim3(ceil_div(C, kParamChannels), chunks), dim3(kParamChannels, kParamRowLanes),
                                     0, as_cuda(stream)>>>(scratch, as_nv(dout), as_nv(inp), mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  layernorm_param_reduce_kernel<<<ceil_div(C, kReduceLanes), dim3(kReduceLanes, kReduceLanes), 0,
                                  as_cuda(stream)>>>(dweight, dbias, scratch, (int)chunks, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
