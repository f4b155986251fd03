// Causal multi-head attention as a fused online-softmax (flash-style)
// kernel (CPU reference: kernels/cpu/attention.cpp). The (T,T) attention
// matrix is never stored: the forward keeps the running max and sum per
// query row and saves the row's log-sum-exp; the backward recomputes the
// probabilities from it.
//
// Tiles of 64 query rows x 64 key rows; 4 warps per block, each owning 16
// query rows (forward, dq) or 16 key rows (dk, dv) of a tile. Products run
// on tensor cores through WMMA (bf16 inputs, fp32 accumulate, 16x16x16
// fragments); the head size is a runtime value, padded with zeros to a
// multiple of 16 in shared memory (zeros add nothing to dot products).
// Softmax statistics, accumulators and the output before rounding are fp32.
//
// Head size 64 takes the register-tile kernels of attention_mma.cu instead;
// these serve every other head size up to 128.
//
// Backward without atomics: one kernel per key tile accumulates dk and dv
// over the query tiles at or after it; another per query tile accumulates
// dq over the key tiles at or before it. Each recomputes the probabilities
// (more FLOPs than FlashAttention-2's atomic dq, but deterministic).
#include <mma.h>

#include "kernels/check.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;      // rows of a query or key tile
constexpr int kWarps = 4;      // 16 rows each
constexpr int kThreads = kWarps * 32;
constexpr int kLdS = kTile + 4;  // fp32 score rows (multiple of 4 for WMMA)
constexpr int kLdP = kTile + 8;  // bf16 probability rows (multiple of 8)
constexpr float kLog2e = 1.4426950408889634f;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, nv_bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, nv_bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, nv_bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, nv_bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Geometry of one launch: padded head size and shared-memory strides.
struct Geometry {
  int hs, hsp;  // head size and head size padded to a multiple of 16
  int ldh;      // bf16 rows of hsp values (+8: fewer bank conflicts, still a multiple of 8)
  int ldo;      // fp32 rows of hsp values (+4)
  int C, C3, T, NH;
  bool vec;  // 16-byte loads of q/k/v/dout rows
};

// A (kTile, hsp) bf16 tile of rows [row0, row0 + 64) from a (T, ld_src)
// matrix; rows >= T and columns >= hs are zero.
__device__ void load_tile(nv_bf16* dst, const nv_bf16* src, int ld_src, int row0, const Geometry& g) {
  if (g.vec) {
    const int per_row = g.hsp / 8;
    for (int idx = threadIdx.x; idx < kTile * per_row; idx += blockDim.x) {
      const int r = idx / per_row, c = (idx % per_row) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row0 + r < g.T && c < g.hs) v = *reinterpret_cast<const uint4*>(src + (size_t)(row0 + r) * ld_src + c);
      *reinterpret_cast<uint4*>(dst + r * g.ldh + c) = v;
    }
  } else {
    for (int idx = threadIdx.x; idx < kTile * g.hsp; idx += blockDim.x) {
      const int r = idx / g.hsp, c = idx % g.hsp;
      nv_bf16 v = to_bf(0.0f);
      if (row0 + r < g.T && c < g.hs) v = src[(size_t)(row0 + r) * ld_src + c];
      dst[r * g.ldh + c] = v;
    }
  }
}

// S (16 rows of warp w, 64 cols) = A_w (16, hsp) @ Bmat^T, Bmat (64, hsp)
// row-major in shared memory: the scores of a warp's rows against a tile.
__device__ void warp_scores(float* S, const nv_bf16* A, const nv_bf16* Bm, int warp, const Geometry& g) {
  for (int j = 0; j < kTile / 16; j++) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < g.hsp / 16; k++) {
      FragA a;
      FragBT b;
      wmma::load_matrix_sync(a, A + (16 * warp) * g.ldh + 16 * k, g.ldh);
      wmma::load_matrix_sync(b, Bm + (16 * j) * g.ldh + 16 * k, g.ldh);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(S + (16 * warp) * kLdS + 16 * j, acc, kLdS, wmma::mem_row_major);
  }
}

// Acc (16 rows of warp w, hsp) += P_w (16, 64) @ V (64, hsp), all in shared
// memory; the accumulator is fp32 with stride ldo.
__device__ void warp_accumulate(float* Acc, const nv_bf16* P, const nv_bf16* V, int warp, const Geometry& g) {
  for (int j = 0; j < g.hsp / 16; j++) {
    FragC acc;
    wmma::load_matrix_sync(acc, Acc + (16 * warp) * g.ldo + 16 * j, g.ldo, wmma::mem_row_major);
    for (int k = 0; k < kTile / 16; k++) {
      FragA a;
      FragB b;
      wmma::load_matrix_sync(a, P + (16 * warp) * kLdP + 16 * k, kLdP);
      wmma::load_matrix_sync(b, V + (16 * k) * g.ldh + 16 * j, g.ldh);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(Acc + (16 * warp) * g.ldo + 16 * j, acc, g.ldo, wmma::mem_row_major);
  }
}

// Acc (16 key rows of warp w, hsp) += P^T (rows of warp w, 64 queries) @ X
// (64 queries, hsp): the transposed product of dk and dv.
__device__ void warp_accumulate_transposed(float* Acc, const nv_bf16* P, const nv_bf16* X, int warp,
                                           const Geometry& g) {
  for (int j = 0; j < g.hsp / 16; j++) {
    FragC acc;
    wmma::load_matrix_sync(acc, Acc + (16 * warp) * g.ldo + 16 * j, g.ldo, wmma::mem_row_major);
    for (int k = 0; k < kTile / 16; k++) {
      FragAT a;  // P^T[16w.., 16k..] is P[16k.., 16w..] read column-major
      FragB b;
      wmma::load_matrix_sync(a, P + (16 * k) * kLdP + 16 * warp, kLdP);
      wmma::load_matrix_sync(b, X + (16 * k) * g.ldh + 16 * j, g.ldh);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(Acc + (16 * warp) * g.ldo + 16 * j, acc, g.ldo, wmma::mem_row_major);
  }
}

// Carves dynamic shared memory into 128-byte aligned regions.
struct Carver {
  char* p;
  template <typename T>
  __device__ T* take(size_t count) {
    T* r = reinterpret_cast<T*>(p);
    p += (count * sizeof(T) + 127) / 128 * 128;
    return r;
  }
};

size_t round128(size_t bytes) { return (bytes + 127) / 128 * 128; }

// ---- forward ----

size_t forward_smem(const Geometry& g) {
  return 3 * round128(sizeof(nv_bf16) * kTile * g.ldh) + round128(sizeof(float) * kTile * kLdS) +
         round128(sizeof(nv_bf16) * kTile * kLdP) + round128(sizeof(float) * kTile * g.ldo) +
         3 * round128(sizeof(float) * kTile);
}

// grid (ceil(T/64), NH, B).
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(nv_bf16* out, float* lse, const nv_bf16* inp,
                                                                     Geometry g, float scale_log2) {
  extern __shared__ __align__(128) char smem[];
  Carver cv{smem};
  nv_bf16* Qs = cv.take<nv_bf16>(kTile * g.ldh);
  nv_bf16* Ks = cv.take<nv_bf16>(kTile * g.ldh);
  nv_bf16* Vs = cv.take<nv_bf16>(kTile * g.ldh);
  float* Ss = cv.take<float>(kTile * kLdS);
  nv_bf16* Ps = cv.take<nv_bf16>(kTile * kLdP);
  float* Os = cv.take<float>(kTile * g.ldo);
  float* row_m = cv.take<float>(kTile);  // running max, log2 units
  float* row_l = cv.take<float>(kTile);  // running sum
  float* row_a = cv.take<float>(kTile);  // this tile's rescale factor

  // Last query tiles (most key tiles under the causal mask) are launched first: less idle tail.
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kTile;
  const nv_bf16* base = inp + (size_t)b * g.T * g.C3 + (size_t)h * g.hs;

  load_tile(Qs, base, g.C3, q0, g);
  for (int i = threadIdx.x; i < kTile * g.ldo; i += blockDim.x) Os[i] = 0.0f;
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    row_m[i] = -INFINITY;
    row_l[i] = 0.0f;
  }

  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // everyone is done with the previous K and V
    load_tile(Ks, base + g.C, g.C3, k0, g);
    load_tile(Vs, base + 2 * g.C, g.C3, k0, g);
    __syncthreads();
    warp_scores(Ss, Qs, Ks, warp, g);
    __syncwarp();
    // Online softmax over this warp's rows; lanes own columns lane, lane+32.
    for (int rr = 0; rr < 16; rr++) {
      const int r = 16 * warp + rr, qi = q0 + r;
      float x[2];
      for (int u = 0; u < 2; u++) {
        const int c = lane + 32 * u, kj = k0 + c;
        x[u] = (kj <= qi && kj < g.T) ? Ss[r * kLdS + c] * scale_log2 : -INFINITY;
      }
      const float m_old = row_m[r];
      // Key 0 is in the first tile and valid for every row, so m_new is finite.
      const float m_new = fmaxf(m_old, warp_max(fmaxf(x[0], x[1])));
      const float p0 = exp2f(x[0] - m_new), p1 = exp2f(x[1] - m_new);
      Ps[r * kLdP + lane] = to_bf(p0);
      Ps[r * kLdP + lane + 32] = to_bf(p1);
      const float tile_sum = warp_sum(p0 + p1);
      __syncwarp();  // every lane has read row_m[r] before lane 0 replaces it (racecheck's WAR warning)
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);  // 0 on the first tile
        row_a[r] = alpha;
        row_m[r] = m_new;
        row_l[r] = row_l[r] * alpha + tile_sum;
      }
    }
    __syncwarp();
    for (int rr = 0; rr < 16; rr++) {
      const int r = 16 * warp + rr;
      const float alpha = row_a[r];
      for (int c = lane; c < g.hsp; c += 32) Os[r * g.ldo + c] *= alpha;
    }
    __syncwarp();
    warp_accumulate(Os, Ps, Vs, warp, g);
    __syncwarp();
  }

  // Rows of this warp: out = O / l, lse = (m + log2 l) in natural units.
  for (int rr = 0; rr < 16; rr++) {
    const int r = 16 * warp + rr, qi = q0 + r;
    if (qi >= g.T) break;
    const float inv = 1.0f / row_l[r];
    nv_bf16* o = out + ((size_t)b * g.T + qi) * g.C + (size_t)h * g.hs;
    for (int c = lane; c < g.hs; c += 32) o[c] = to_bf(Os[r * g.ldo + c] * inv);
    if (lane == 0) lse[((size_t)b * g.NH + h) * g.T + qi] = (row_m[r] + log2f(row_l[r])) / kLog2e;
  }
}

// ---- backward ----

// D (B,NH,T) = rowsum(dout * out) per head: one warp per (b, t, h).
__global__ void attention_backward_dot_kernel(float* D, const nv_bf16* dout, const nv_bf16* out, Geometry g,
                                              int B) {
  const size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= (size_t)B * g.T * g.NH) return;
  const int h = (int)(row % g.NH);
  const size_t bt = row / g.NH;  // b * T + t
  const size_t off = bt * g.C + (size_t)h * g.hs;
  float s = 0.0f;
  for (int c = lane; c < g.hs; c += 32) s += to_f(dout[off + c]) * to_f(out[off + c]);
  s = warp_sum(s);
  if (lane == 0) {
    const int b = (int)(bt / g.T), t = (int)(bt % g.T);
    D[((size_t)b * g.NH + h) * g.T + t] = s;
  }
}

// For the 16 query rows of warp w against one key tile: P (bf16, Ps) from
// the scores in Ss, then dP = dO_w V^T into Ss, then dS = P (dP - D) (bf16,
// dSs). lse and D are this query tile's (natural units).
__device__ void warp_probs_and_dscores(float* Ss, nv_bf16* Ps, nv_bf16* dSs, const nv_bf16* dOs, const nv_bf16* Vs,
                                       const float* lse_s, const float* D_s, int q0, int k0, int warp,
                                       float scale_log2, const Geometry& g) {
  const int lane = threadIdx.x % 32;
  for (int rr = 0; rr < 16; rr++) {
    const int r = 16 * warp + rr, qi = q0 + r;
    const float l2 = lse_s[r] * kLog2e;
    for (int c = lane; c < kTile; c += 32) {
      const int kj = k0 + c;
      const float p = (kj <= qi && qi < g.T) ? exp2f(Ss[r * kLdS + c] * scale_log2 - l2) : 0.0f;
      Ps[r * kLdP + c] = to_bf(p);
    }
  }
  __syncwarp();
  warp_scores(Ss, dOs, Vs, warp, g);  // dP
  __syncwarp();
  for (int rr = 0; rr < 16; rr++) {
    const int r = 16 * warp + rr;
    const float d = D_s[r];
    for (int c = lane; c < kTile; c += 32)
      dSs[r * kLdP + c] = to_bf(to_f(Ps[r * kLdP + c]) * (Ss[r * kLdS + c] - d));
  }
  __syncwarp();
}

__device__ void load_row_stats(float* lse_s, float* D_s, const float* lse, const float* D, size_t head_row0, int q0,
                               int T) {
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    const bool in = q0 + i < T;
    lse_s[i] = in ? lse[head_row0 + q0 + i] : 0.0f;
    D_s[i] = in ? D[head_row0 + q0 + i] : 0.0f;
  }
}

size_t backward_kv_smem(const Geometry& g) {
  return 4 * round128(sizeof(nv_bf16) * kTile * g.ldh) + round128(sizeof(float) * kTile * kLdS) +
         2 * round128(sizeof(nv_bf16) * kTile * kLdP) + 2 * round128(sizeof(float) * kTile * g.ldo) +
         2 * round128(sizeof(float) * kTile);
}

// grid (ceil(T/64), NH, B): dk and dv of one key tile.
__global__ void __launch_bounds__(kThreads) attention_backward_kv_kernel(nv_bf16* dinp, const nv_bf16* dout,
                                                                         const nv_bf16* inp, const float* lse,
                                                                         const float* D, Geometry g,
                                                                         float scale_log2, float scale) {
  extern __shared__ __align__(128) char smem[];
  Carver cv{smem};
  nv_bf16* Ks = cv.take<nv_bf16>(kTile * g.ldh);
  nv_bf16* Vs = cv.take<nv_bf16>(kTile * g.ldh);
  nv_bf16* Qs = cv.take<nv_bf16>(kTile * g.ldh);
  nv_bf16* dOs = cv.take<nv_bf16>(kTile * g.ldh);
  float* Ss = cv.take<float>(kTile * kLdS);
  nv_bf16* Ps = cv.take<nv_bf16>(kTile * kLdP);
  nv_bf16* dSs = cv.take<nv_bf16>(kTile * kLdP);
  float* dKs = cv.take<float>(kTile * g.ldo);
  float* dVs = cv.take<float>(kTile * g.ldo);
  float* lse_s = cv.take<float>(kTile);
  float* D_s = cv.take<float>(kTile);

  const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k0 = kt * kTile;
  const nv_bf16* base = inp + (size_t)b * g.T * g.C3 + (size_t)h * g.hs;
  const nv_bf16* dbase = dout + (size_t)b * g.T * g.C + (size_t)h * g.hs;
  const size_t head_row0 = ((size_t)b * g.NH + h) * g.T;
  const int tiles = (g.T + kTile - 1) / kTile;

  load_tile(Ks, base + g.C, g.C3, k0, g);
  load_tile(Vs, base + 2 * g.C, g.C3, k0, g);
  for (int i = threadIdx.x; i < kTile * g.ldo; i += blockDim.x) dKs[i] = dVs[i] = 0.0f;

  for (int qt = kt; qt < tiles; qt++) {
    const int q0 = qt * kTile;
    __syncthreads();  // previous Q, dO, P, dS fully used
    load_tile(Qs, base, g.C3, q0, g);
    load_tile(dOs, dbase, g.C, q0, g);
    load_row_stats(lse_s, D_s, lse, D, head_row0, q0, g.T);
    __syncthreads();
    warp_scores(Ss, Qs, Ks, warp, g);
    __syncwarp();
    warp_probs_and_dscores(Ss, Ps, dSs, dOs, Vs, lse_s, D_s, q0, k0, warp, scale_log2, g);
    __syncthreads();  // the transposed products read every warp's rows
    warp_accumulate_transposed(dVs, Ps, dOs, warp, g);
    warp_accumulate_transposed(dKs, dSs, Qs, warp, g);
  }
  __syncwarp();
  for (int rr = 0; rr < 16; rr++) {
    const int r = 16 * warp + rr, kj = k0 + r;
    if (kj >= g.T) break;
    nv_bf16* d = dinp + ((size_t)b * g.T + kj) * g.C3 + (size_t)h * g.hs;
    for (int c = lane; c < g.hs; c += 32) {
      d[g.C + c] = to_bf(dKs[r * g.ldo + c] * scale);
      d[2 * g.C + c] = to_bf(dVs[r * g.ldo + c]);
    }
  }
}

size_t backward_q_smem(const Geometry& g) {
  return 4 * round128(sizeof(nv_bf16) * kTile * g.ldh) + round128(sizeof(float) * kTile * kLdS) +
         2 * round128(sizeof(nv_bf16) * kTile * kLdP) + round128(sizeof(float) * kTile * g.ldo) +
         2 * round128(sizeof(float) * kTile);
}

// grid (ceil(T/64), NH, B): dq of one query tile.
__global__ void __launch_bounds__(kThreads) attention_backward_q_kernel(nv_bf16* dinp, const nv_bf16* dout,
                                                                        const nv_bf16* inp, const float* lse,
                                                                        const float* D, Geometry g,
                                                                        float scale_log2, float scale) {
  extern __shared__ __align__(128) char smem[];
  Carver cv{smem};
  nv_bf16* Qs = cv.take<nv_bf16>(kTile * g.ldh);
  nv_bf16* dOs = cv.take<nv_bf16>(kTile * g.ldh);
  nv_bf16* Ks = cv.take<nv_bf16>(kTile * g.ldh);
  nv_bf16* Vs = cv.take<nv_bf16>(kTile * g.ldh);
  float* Ss = cv.take<float>(kTile * kLdS);
  nv_bf16* Ps = cv.take<nv_bf16>(kTile * kLdP);
  nv_bf16* dSs = cv.take<nv_bf16>(kTile * kLdP);
  float* dQs = cv.take<float>(kTile * g.ldo);
  float* lse_s = cv.take<float>(kTile);
  float* D_s = cv.take<float>(kTile);

  // Last query tiles (most key tiles under the causal mask) are launched first: less idle tail.
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kTile;
  const nv_bf16* base = inp + (size_t)b * g.T * g.C3 + (size_t)h * g.hs;
  const nv_bf16* dbase = dout + (size_t)b * g.T * g.C + (size_t)h * g.hs;
  const size_t head_row0 = ((size_t)b * g.NH + h) * g.T;

  load_tile(Qs, base, g.C3, q0, g);
  load_tile(dOs, dbase, g.C, q0, g);
  load_row_stats(lse_s, D_s, lse, D, head_row0, q0, g.T);
  for (int i = threadIdx.x; i < kTile * g.ldo; i += blockDim.x) dQs[i] = 0.0f;

  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // previous K and V fully used
    load_tile(Ks, base + g.C, g.C3, k0, g);
    load_tile(Vs, base + 2 * g.C, g.C3, k0, g);
    __syncthreads();
    warp_scores(Ss, Qs, Ks, warp, g);
    __syncwarp();
    warp_probs_and_dscores(Ss, Ps, dSs, dOs, Vs, lse_s, D_s, q0, k0, warp, scale_log2, g);
    warp_accumulate(dQs, dSs, Ks, warp, g);  // this warp's rows only
    __syncwarp();
  }
  for (int rr = 0; rr < 16; rr++) {
    const int r = 16 * warp + rr, qi = q0 + r;
    if (qi >= g.T) break;
    nv_bf16* d = dinp + ((size_t)b * g.T + qi) * g.C3 + (size_t)h * g.hs;
    for (int c = lane; c < g.hs; c += 32) d[c] = to_bf(dQs[r * g.ldo + c] * scale);
  }
}

Geometry geometry(const void* a, const void* b, int B, int T, int C, int NH) {
  DL_CHECK(NH > 0 && C % NH == 0, "attention: C %d not a multiple of NH %d", C, NH);
  Geometry g;
  g.hs = C / NH;
  DL_CHECK(g.hs <= kMaxAttentionHeadSize, "attention: head size %d > %d", g.hs, kMaxAttentionHeadSize);
  g.hsp = (g.hs + 15) / 16 * 16;
  g.ldh = g.hsp + 8;
  g.ldo = g.hsp + 4;
  g.C = C;
  g.C3 = 3 * C;
  g.T = T;
  g.NH = NH;
  const auto al16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  g.vec = g.hs % 8 == 0 && C % 8 == 0 && al16(a) && al16(b);
  return g;
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

}  // namespace

void attention_forward(bf16* out, float* lse, const bf16* inp, int B, int T, int C, int NH, Stream stream) {
  if (B == 0 || T == 0) return;
  if (attention_mma_supported(C, NH, {out, inp})) return attention_forward_mma(out, lse, inp, B, T, C, NH, stream);
  const Geometry g = geometry(inp, inp, B, T, C, NH);
  const float scale_log2 = kLog2e / sqrtf((float)g.hs);
  const size_t smem = forward_smem(g);
  allow_smem(attention_forward_kernel, smem);
  const dim3 grid(ceil_div(T, kTile), NH, B);
  attention_forward_kernel<<<grid, kThreads, smem, as_cuda(stream)>>>(as_nv(out), lse, as_nv(inp), g, scale_log2);
  CUDA_CHECK_LAUNCH();
}

size_t attention_backward_scratch_floats(int B, int T, int NH) { return (size_t)B * NH * T; }

void attention_backward(bf16* dinp, float* scratch, const bf16* dout, const bf16* inp, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, Stream stream) {
  if (B == 0 || T == 0) return;
  const Geometry g = geometry(inp, dout, B, T, C, NH);
  const float scale = 1.0f / sqrtf((float)g.hs);
  const float scale_log2 = kLog2e * scale;
  cudaStream_t s = as_cuda(stream);
  const size_t rows = (size_t)B * T * NH;
  attention_backward_dot_kernel<<<ceil_div(rows, 8), 256, 0, s>>>(scratch, as_nv(dout), as_nv(out), g, B);
  CUDA_CHECK_LAUNCH();
  if (attention_mma_supported(C, NH, {dinp, dout, inp}))
    return attention_backward_mma(dinp, dout, inp, lse, scratch, B, T, C, NH, stream);
  const dim3 grid(ceil_div(T, kTile), NH, B);
  const size_t smem_kv = backward_kv_smem(g), smem_q = backward_q_smem(g);
  allow_smem(attention_backward_kv_kernel, smem_kv);
  allow_smem(attention_backward_q_kernel, smem_q);
  attention_backward_kv_kernel<<<grid, kThreads, smem_kv, s>>>(as_nv(dinp), as_nv(dout), as_nv(inp), lse, scratch,
                                                               g, scale_log2, scale);
  CUDA_CHECK_LAUNCH();
  attention_backward_q_kernel<<<grid, kThreads, smem_q, s>>>(as_nv(dinp), as_nv(dout), as_nv(inp), lse, scratch, g,
                                                             scale_log2, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
