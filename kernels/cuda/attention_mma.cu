// Causal attention for a head size of 64 with the tiles in registers
// (FlashAttention-2's layout), the fast path of attention.cu: same inputs,
// outputs and lse/D conventions, same bf16 roundings of P and dS.
//
// Products are mma.sync m16n8k16 (bf16 in, fp32 accumulate). A warp owns 16
// rows of a 64-row tile; its scores, probabilities and accumulators stay in
// the mma fragment registers, and a score fragment becomes the next
// product's A operand without leaving them. Shared memory holds only the
// 64 x 64 bf16 tiles of q, k, v and dout, read with ldmatrix (.trans where
// the product needs the tile transposed). Rows are 72 values apart, so the
// eight 16-byte rows of an ldmatrix fall in distinct banks.
//
// Fragment layout (PTX ISA, mma.m16n8k16): with g = lane / 4 and c = lane % 4,
// an accumulator holds (row g, cols 2c, 2c+1) and (row g+8, cols 2c, 2c+1)
// of its 16 x 8 tile; an A operand holds rows g and g+8 at cols 2c, 2c+1 and
// 2c+8, 2c+9 of its 16 x 16 tile; a B operand holds (k 2c, 2c+1, n g) and
// (k 2c+8, 2c+9, n g).
//
// Backward as in attention.cu, without atomics: one kernel per key tile for
// dk and dv, one per query tile for dq.
#include "kernels/cuda/attention_mma.h"

#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

namespace {

constexpr int kHs = 64;       // head size of this path
constexpr int kTile = 64;     // rows of a query or key tile
constexpr int kThreads = 128;  // 4 warps x 16 rows
constexpr int kLd = kHs + 8;  // bf16 row stride of a shared tile
constexpr int kKSteps = kHs / 16;  // k-steps over the head dimension
constexpr int kNTiles = kTile / 8;  // 8-wide column tiles of a 64-wide score row
constexpr int kDTiles = kHs / 8;    // 8-wide column tiles of a 64-wide output row
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// d += a (16x16, row) * b (16x8, col).
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const nv_bf16* row) {
  const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const nv_bf16* row) {
  const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// cp.async: global -> shared without passing through registers, so the
// next tile loads while this one is used. src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `pending` of this thread's committed groups are in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// Starts copying rows [row0, row0 + 64) x 64 columns of a matrix with row
// stride ld into a shared tile; rows >= T become zeros (their source
// address is row 0's, never read).
__device__ void load_tile(nv_bf16* dst, const nv_bf16* src, size_t ld, int row0, int T) {
  for (int i = threadIdx.x; i < kTile * (kHs / 8); i += kThreads) {
    const int r = i / (kHs / 8), c = (i % (kHs / 8)) * 8;
    const bool valid = row0 + r < T;
    cp_async16(dst + r * kLd + c, src + (size_t)(valid ? row0 + r : 0) * ld + c, valid);
  }
}

// Starts copying lse and D of the 64 rows of a query tile (0 past T).
__device__ void load_row_stats(float* lse_s, float* D_s, const float* lse, const float* D, int q0, int T) {
  const int i = threadIdx.x;
  if (i < kTile) {
    const bool valid = q0 + i < T;
    cp_async4(lse_s + i, lse + (valid ? q0 + i : 0), valid);
    cp_async4(D_s + i, D + (valid ? q0 + i : 0), valid);
  }
}

// A operands of rows [r0, r0 + 16) of a shared tile, one per k-step.
__device__ __forceinline__ void load_a(uint32_t (&a)[kKSteps][4], const nv_bf16* tile, int r0, int lane) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ks++) ldmatrix_x4(a[ks], tile + (r0 + lane % 16) * kLd + 16 * ks + (lane / 16) * 8);
}

// acc (16 x 64) = a (16 x 64) * tile^T: the tile's rows are the product's
// columns (scores against keys, or dout against v).
__device__ __forceinline__ void product_nt(float (&acc)[kNTiles][4], const uint32_t (&a)[kKSteps][4],
                                           const nv_bf16* tile, int lane) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ks++) {
#pragma unroll
    for (int p = 0; p < kNTiles / 2; p++) {
      uint32_t b[4];
      ldmatrix_x4(b, tile + (16 * p + (lane / 16) * 8 + lane % 8) * kLd + 16 * ks + ((lane / 8) % 2) * 8);
      mma(acc[2 * p], a[ks], b[0], b[1]);
      mma(acc[2 * p + 1], a[ks], b[2], b[3]);
    }
  }
}

// acc (16 x 64) += x (16 x 64 rows of the tile, in accumulator layout,
// rounded to bf16) * tile (64 x 64): probabilities times v, dS times k, ...
__device__ __forceinline__ void product_nn(float (&acc)[kDTiles][4], const float (&x)[kNTiles][4],
                                           const nv_bf16* tile, int lane) {
#pragma unroll
  for (int j = 0; j < kTile / 16; j++) {
    const uint32_t a[4] = {pack_bf16(x[2 * j][0], x[2 * j][1]), pack_bf16(x[2 * j][2], x[2 * j][3]),
                           pack_bf16(x[2 * j + 1][0], x[2 * j + 1][1]), pack_bf16(x[2 * j + 1][2], x[2 * j + 1][3])};
#pragma unroll
    for (int p = 0; p < kDTiles / 2; p++) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, tile + (16 * j + lane % 16) * kLd + 16 * p + (lane / 16) * 8);
      mma(acc[2 * p], a, b[0], b[1]);
      mma(acc[2 * p + 1], a, b[2], b[3]);
    }
  }
}

// 2^x by the hardware's approximation (relative error ~2^-22, subnormal
// results flushed to 0: probabilities that small vanish in bf16 anyway).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Writes rows (g, g+8) of a 16 x 64 accumulator times scale to dst rows
// r_lo and r_lo + 8 (row stride ld), skipping rows >= T.
__device__ __forceinline__ void store_rows(nv_bf16* dst, size_t ld, const float (&acc)[kDTiles][4], float scale_lo,
                                           float scale_hi, int r_lo, int T, int lane) {
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int r = r_lo + 8 * half;
    if (r >= T) continue;
    const float s = half ? scale_hi : scale_lo;
    nv_bf16* row = dst + (size_t)r * ld + (lane % 4) * 2;
#pragma unroll
    for (int dt = 0; dt < kDTiles; dt++)
      *reinterpret_cast<uint32_t*>(row + 8 * dt) = pack_bf16(acc[dt][2 * half] * s, acc[dt][2 * half + 1] * s);
  }
}

// grid (ceil(T/64), NH, B). K and V tiles are double-buffered: tile kt + 1
// loads while tile kt is multiplied.
__global__ void __launch_bounds__(kThreads) forward_kernel(nv_bf16* out, float* lse, const nv_bf16* inp, int T,
                                                           int C, int NH, float scale_log2) {
  __shared__ __align__(16) nv_bf16 Qs[kTile * kLd], Kbuf[2][kTile * kLd], Vbuf[2][kTile * kLd];
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // heaviest tiles first
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kTile, r_lo = q0 + 16 * warp + lane / 4;  // this thread's rows: r_lo, r_lo + 8
  const size_t C3 = 3 * (size_t)C;
  const nv_bf16* base = inp + (size_t)b * T * C3 + (size_t)h * kHs;

  load_tile(Qs, base, C3, q0, T);
  load_tile(Kbuf[0], base + C, C3, 0, T);
  load_tile(Vbuf[0], base + 2 * C, C3, 0, T);
  cp_async_commit();
  uint32_t qf[kKSteps][4];
  float o[kDTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // running max (log2 units), partial sums
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * kTile;
    if (kt < qt) {  // the buffer it fills was released by the barrier that ended kt - 1
      load_tile(Kbuf[(kt + 1) & 1], base + C, C3, k0 + kTile, T);
      load_tile(Vbuf[(kt + 1) & 1], base + 2 * C, C3, k0 + kTile, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile kt has landed for every thread
    if (kt == 0) load_a(qf, Qs, 16 * warp, lane);
    const nv_bf16* Ks = Kbuf[kt & 1];
    const nv_bf16* Vs = Vbuf[kt & 1];
    float s[kNTiles][4];
    product_nt(s, qf, Ks, lane);
    const bool diagonal = kt == qt;  // the causal edge, and keys >= T (only in the last tile)
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int key = k0 + 8 * nt + (lane % 4) * 2 + (i & 1), row = r_lo + 8 * (i >> 1);
        s[nt][i] = diagonal && (key > row || key >= T) ? -INFINITY : s[nt][i] * scale_log2;
      }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt++) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    // Key 0 is in the first tile and valid for every row, so the max is finite from then on.
    mx[0] = quad_max(mx[0]);
    mx[1] = quad_max(mx[1]);
    const float alpha[2] = {fast_exp2(m[0] - mx[0]), fast_exp2(m[1] - mx[1])};  // 0 on the first tile
    m[0] = mx[0], m[1] = mx[1];
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        s[nt][i] = fast_exp2(s[nt][i] - m[i >> 1]);
        rs[i >> 1] += s[nt][i];
      }
    l[0] = l[0] * alpha[0] + rs[0];
    l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
    for (int dt = 0; dt < kDTiles; dt++) {
      o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
    }
    product_nn(o, s, Vs, lane);
    __syncthreads();  // every warp is done with buffer kt & 1
  }
  l[0] = quad_sum(l[0]);
  l[1] = quad_sum(l[1]);
  store_rows(out + (size_t)b * T * C + (size_t)h * kHs, C, o, 1.0f / l[0], 1.0f / l[1], r_lo, T, lane);
  if (lane % 4 == 0) {
    float* lrow = lse + ((size_t)b * NH + h) * T;
    if (r_lo < T) lrow[r_lo] = (m[0] + log2f(l[0])) / kLog2e;
    if (r_lo + 8 < T) lrow[r_lo + 8] = (m[1] + log2f(l[1])) / kLog2e;
  }
}

// grid (ceil(T/64), NH, B): dk and dv of one key tile. A warp owns 16 keys
// and works on the transposed products: S^T = K Q^T, P^T, dP^T = V dO^T.
// Q, dO, lse and D tiles are double-buffered; buffer 1 first carries K and V.
__global__ void __launch_bounds__(kThreads) backward_kv_kernel(nv_bf16* dinp, const nv_bf16* dout,
                                                               const nv_bf16* inp, const float* lse, const float* D,
                                                               int T, int C, int NH, float scale_log2, float scale) {
  __shared__ __align__(16) nv_bf16 Qbuf[2][kTile * kLd], dObuf[2][kTile * kLd];
  __shared__ float lse_buf[2][kTile], D_buf[2][kTile];
  const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // first key tiles see the most queries
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k0 = kt * kTile, key_lo = k0 + 16 * warp + lane / 4;  // this thread's keys: key_lo, key_lo + 8
  const size_t C3 = 3 * (size_t)C;
  const nv_bf16* base = inp + (size_t)b * T * C3 + (size_t)h * kHs;
  const nv_bf16* dbase = dout + (size_t)b * T * C + (size_t)h * kHs;
  const size_t head_row0 = ((size_t)b * NH + h) * T;
  const int tiles = (T + kTile - 1) / kTile;

  load_tile(Qbuf[1], base + C, C3, k0, T);       // K
  load_tile(dObuf[1], base + 2 * C, C3, k0, T);  // V
  load_tile(Qbuf[0], base, C3, k0, T);           // query tile kt
  load_tile(dObuf[0], dbase, C, k0, T);
  load_row_stats(lse_buf[0], D_buf[0], lse + head_row0, D + head_row0, k0, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t kf[kKSteps][4], vf[kKSteps][4];
  load_a(kf, Qbuf[1], 16 * warp, lane);
  load_a(vf, dObuf[1], 16 * warp, lane);
  __syncthreads();  // buffer 1 is free for the next query tile

  float dk[kDTiles][4] = {}, dv[kDTiles][4] = {};
  for (int qt = kt; qt < tiles; qt++) {
    const int q0 = qt * kTile, cur = (qt - kt) & 1;
    if (qt + 1 < tiles) {
      load_tile(Qbuf[cur ^ 1], base, C3, q0 + kTile, T);
      load_tile(dObuf[cur ^ 1], dbase, C, q0 + kTile, T);
      load_row_stats(lse_buf[cur ^ 1], D_buf[cur ^ 1], lse + head_row0, D + head_row0, q0 + kTile, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // query tile qt has landed for every thread
    const nv_bf16* Qs = Qbuf[cur];
    const nv_bf16* dOs = dObuf[cur];
    const float* lse_s = lse_buf[cur];
    const float* D_s = D_buf[cur];
    const bool edge = qt == kt || q0 + kTile > T;  // the causal diagonal, or queries past T
    float pt[kNTiles][4], dpt[kNTiles][4];
    product_nt(pt, kf, Qs, lane);   // S^T
    product_nt(dpt, vf, dOs, lane);  // dP^T
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int qc = 8 * nt + (lane % 4) * 2 + (i & 1), q = q0 + qc, key = key_lo + 8 * (i >> 1);
        const bool in = !edge || (q >= key && q < T);
        const float p = in ? fast_exp2(pt[nt][i] * scale_log2 - lse_s[qc] * kLog2e) : 0.0f;
        pt[nt][i] = p;
        dpt[nt][i] = p * (dpt[nt][i] - D_s[qc]);  // dS^T
      }
    product_nn(dv, pt, dOs, lane);  // dV += P^T dO
    product_nn(dk, dpt, Qs, lane);  // dK += dS^T Q
    __syncthreads();  // every warp is done with buffer cur
  }
  nv_bf16* drow = dinp + (size_t)b * T * C3 + (size_t)h * kHs;
  store_rows(drow + C, C3, dk, scale, scale, key_lo, T, lane);
  store_rows(drow + 2 * C, C3, dv, 1.0f, 1.0f, key_lo, T, lane);
}

// grid (ceil(T/64), NH, B): dq of one query tile. K and V tiles are
// double-buffered; buffer 1 first carries Q and dO.
__global__ void __launch_bounds__(kThreads) backward_q_kernel(nv_bf16* dinp, const nv_bf16* dout,
                                                              const nv_bf16* inp, const float* lse, const float* D,
                                                              int T, int C, int NH, float scale_log2, float scale) {
  __shared__ __align__(16) nv_bf16 Kbuf[2][kTile * kLd], Vbuf[2][kTile * kLd];
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // heaviest tiles first
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kTile, r_lo = q0 + 16 * warp + lane / 4;
  const size_t C3 = 3 * (size_t)C;
  const nv_bf16* base = inp + (size_t)b * T * C3 + (size_t)h * kHs;
  const nv_bf16* dbase = dout + (size_t)b * T * C + (size_t)h * kHs;
  const size_t head_row0 = ((size_t)b * NH + h) * T;

  load_tile(Kbuf[1], base, C3, q0, T);  // Q
  load_tile(Vbuf[1], dbase, C, q0, T);  // dO
  load_tile(Kbuf[0], base + C, C3, 0, T);
  load_tile(Vbuf[0], base + 2 * C, C3, 0, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kKSteps][4], dof[kKSteps][4];
  load_a(qf, Kbuf[1], 16 * warp, lane);
  load_a(dof, Vbuf[1], 16 * warp, lane);
  __syncthreads();  // buffer 1 is free for the next key tile
  float lse2[2], Dr[2];
  for (int half = 0; half < 2; half++) {
    const int r = r_lo + 8 * half;
    lse2[half] = r < T ? lse[head_row0 + r] * kLog2e : 0.0f;
    Dr[half] = r < T ? D[head_row0 + r] : 0.0f;
  }

  float dq[kDTiles][4] = {};
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * kTile;
    if (kt < qt) {
      load_tile(Kbuf[(kt + 1) & 1], base + C, C3, k0 + kTile, T);
      load_tile(Vbuf[(kt + 1) & 1], base + 2 * C, C3, k0 + kTile, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // key tile kt has landed for every thread
    const nv_bf16* Ks = Kbuf[kt & 1];
    const nv_bf16* Vs = Vbuf[kt & 1];
    float p[kNTiles][4], dp[kNTiles][4];
    product_nt(p, qf, Ks, lane);    // S
    product_nt(dp, dof, Vs, lane);  // dP
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int key = k0 + 8 * nt + (lane % 4) * 2 + (i & 1), row = r_lo + 8 * (i >> 1);
        const bool in = kt < qt || (key <= row && key < T);  // keys >= T only in the diagonal tile
        const float pv = in ? fast_exp2(p[nt][i] * scale_log2 - lse2[i >> 1]) : 0.0f;
        dp[nt][i] = pv * (dp[nt][i] - Dr[i >> 1]);  // dS
      }
    product_nn(dq, dp, Ks, lane);  // dQ += dS K
    __syncthreads();  // every warp is done with buffer kt & 1
  }
  store_rows(dinp + (size_t)b * T * C3 + (size_t)h * kHs, C3, dq, scale, scale, r_lo, T, lane);
}

bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

}  // namespace

bool attention_mma_supported(int C, int NH, std::initializer_list<const void*> pointers) {
  if (NH <= 0 || C != kHs * NH) return false;
  for (const void* p : pointers)
    if (!aligned(p, 16)) return false;
  return true;
}

void attention_forward_mma(bf16* out, float* lse, const bf16* inp, int B, int T, int C, int NH, Stream stream) {
  const dim3 grid(ceil_div(T, kTile), NH, B);
  forward_kernel<<<grid, kThreads, 0, as_cuda(stream)>>>(as_nv(out), lse, as_nv(inp), T, C, NH,
                                                         kLog2e / sqrtf((float)kHs));
  CUDA_CHECK_LAUNCH();
}

void attention_backward_mma(bf16* dinp, const bf16* dout, const bf16* inp, const float* lse, const float* D, int B,
                            int T, int C, int NH, Stream stream) {
  const float scale = 1.0f / sqrtf((float)kHs);
  const dim3 grid(ceil_div(T, kTile), NH, B);
  backward_kv_kernel<<<grid, kThreads, 0, as_cuda(stream)>>>(as_nv(dinp), as_nv(dout), as_nv(inp), lse, D, T, C, NH,
                                                             kLog2e * scale, scale);
  CUDA_CHECK_LAUNCH();
  backward_q_kernel<<<grid, kThreads, 0, as_cuda(stream)>>>(as_nv(dinp), as_nv(dout), as_nv(inp), lse, D, T, C, NH,
                                                            kLog2e * scale, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
