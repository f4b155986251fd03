// The chunked top-k codec's encoder on the device: byte for byte the records of
// sparse_encode_chunk (kernels/cpu/sync_sparse.cpp, the reference), whose
// arithmetic kernels/sync_sparse.h pins. Checked by tests/kernels/test_cuda_sparse.cpp.
//
// One thread block per chunk:
//   1. selection  the kc largest keys (the sign-cleared fp32 bits, exact) by a
//      radix select over the 31-bit keys, 8 bits a pass (histograms counted
//      with shared-memory atomics, one per digit per warp: integer counts, so
//      the result does not depend on their order): the threshold key T, and how many of the values
//      whose key equals T are kept (the lowest indices: ties to the lower index);
//   2. compaction in index order (ballot scans over tiles of the chunk) of the
//      kept indices into the caller's scratch;
//   3. one thread sums the kept squares in double, in index order (the pinned
//      order: a serial loop, kc is small), and computes w and inv;
//   4. every thread packs whole bytes of indices and codes, LSB first: byte k
//      gathers the bits [8k, 8k + 8) of the entries that cover them, so pad bits
//      stay 0.
// Every rounding is an explicit _rn intrinsic, and the file is compiled with
// --fmad=false (kernels/cuda/CMakeLists.txt), so nothing is contracted.
#include <cfloat>

#include "kernels/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/sync_sparse.h"

namespace diloco::cuda {

namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr int kThreads = 256;  // a multiple of 32, at most 1024 (one block per chunk)
constexpr int kWarps = kThreads / 32;

struct SparseShape {
  size_t n;            // values in all
  int chunk;           // C
  int kc_full;         // values kept of a full chunk (sparse_keep_of(C, C, keep))
  int kc_last;         // values kept of the last chunk (= kc_full when it is full)
  size_t record_full;  // bytes of a full chunk's record: chunk i's record starts at i * record_full
  int index_bits;      // sparse_index_bits(C)
  int bits;            // code bits: 2, 4 or 8
  double w_factor;     // 2 * kSparseRange / 2^bits (exact)
};

// The exclusive count of set flags before this thread in the block, and the
// block's total in *total. Every thread of the block calls it; warp_counts
// holds kWarps ints.
__device__ int block_flag_scan(bool flag, int* warp_counts, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  __syncthreads();  // warp_counts may still be read from the previous call
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, sum = 0;
  for (int w = 0; w < kWarps; w++) {
    const int c = warp_counts[w];
    before += w < warp ? c : 0;
    sum += c;
  }
  *total = sum;
  return before + in_warp;
}

// Byte k of `count` entries of `width` bits packed LSB first (entry j at bits
// [j * width, (j + 1) * width)); bits past the last entry are 0. entry(j)
// gives entry j (< 2^width).
template <typename Entry>
__device__ __forceinline__ uint8_t packed_byte(size_t k, int count, int width, Entry entry) {
  const long long lo = 8 * (long long)k;
  uint32_t byte = 0;
  for (long long j = lo / width; j < count && j * width < lo + 8; j++) {
    const uint64_t v = entry((int)j);
    const long long s = j * width - lo;  // where entry j's bit 0 lands in this byte
    byte |= (uint32_t)(s >= 0 ? v << s : v >> -s);
  }
  return (uint8_t)byte;
}

__global__ void sparse_encode_kernel(uint8_t* records, uint32_t* scratch, int* bad, const float* x, SparseShape sh) {
  __shared__ int hist[256];
  __shared__ int warp_counts[kWarps];
  __shared__ int found_digit, found_above, nonfinite;
  __shared__ float s_w, s_inv;

  const size_t chunk_id = blockIdx.x;
  const size_t lo = chunk_id * (size_t)sh.chunk;
  const int len = (int)(sh.n - lo < (size_t)sh.chunk ? sh.n - lo : (size_t)sh.chunk);
  const int kc = len == sh.chunk ? sh.kc_full : sh.kc_last;
  const float* xc = x + lo;
  uint32_t* kept = scratch + chunk_id * (size_t)sh.kc_full;
  uint8_t* record = records + chunk_id * sh.record_full;
  const int tid = threadIdx.x;
  if (tid == 0) nonfinite = 0;

  // ---- 1. radix select: T = the kc-th largest key, need_eq = how many keys == T are kept ----
  uint32_t prefix = 0;  // the digits of T found so far
  int remaining = kc;   // rank of T among the keys that match prefix (1 = the largest)
  for (int shift = 24; shift >= 0; shift -= 8) {
    const uint32_t hi_mask = shift == 24 ? 0u : ~((1u << (shift + 8)) - 1u);
    for (int d = tid; d < 256; d += kThreads) hist[d] = 0;
    __syncthreads();
    bool local_bad = false;
    for (int base = 0; base < len; base += kThreads) {  // whole warps: __match_any_sync below
      const int i = base + tid;
      const uint32_t key = i < len ? __float_as_uint(xc[i]) & kAbsMask : 0u;
      local_bad |= key >= kInfBits;
      const bool counted = i < len && (key & hi_mask) == prefix;
      // Values of one chunk crowd a few digits (the exponent's): one atomic per digit per warp.
      const uint32_t digit = counted ? (key >> shift) & 0xffu : 256u;
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (counted && (__ffs(peers) - 1) == tid % 32) atomicAdd(&hist[digit], __popc(peers));
    }
    if (shift == 24 && local_bad) nonfinite = 1;  // every writer writes 1
    __syncthreads();
    // Warp 0 finds the digit d of T: count(digit > d) < remaining <= count(digit >= d).
    if (tid < 32) {
      int bins[8], s = 0;
      for (int b = 0; b < 8; b++) s += bins[b] = hist[8 * tid + b];
      int suffix = s;  // inclusive sum over lanes >= tid
      for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_down_sync(0xffffffffu, suffix, o);
        if (tid + o < 32) suffix += t;
      }
      int above = suffix - s;  // keys in the bins of the lanes above
      for (int b = 7; b >= 0; b--) {
        if (above < remaining && above + bins[b] >= remaining) {
          found_digit = 8 * tid + b;
          found_above = above;
        }
        above += bins[b];
      }
    }
    __syncthreads();
    prefix |= (uint32_t)found_digit << shift;
    remaining -= found_above;
    __syncthreads();  // found_* are written again by the next pass
  }
  const uint32_t T = prefix;
  const int need_eq = remaining;  // the lowest-index keys equal to T that are kept

  // ---- 2. the kept indices, in index order ----
  int kept_so_far = 0, eq_so_far = 0;
  for (int base = 0; base < len && kept_so_far < kc; base += kThreads) {
    const int i = base + tid;
    const uint32_t key = i < len ? __float_as_uint(xc[i]) & kAbsMask : 0u;
    const bool gt = i < len && key > T, eq = i < len && key == T;
    int eq_total = 0, kept_total = 0;
    const int eq_rank = eq_so_far + block_flag_scan(eq, warp_counts, &eq_total);
    const bool keep = gt || (eq && eq_rank < need_eq);
    const int pos = kept_so_far + block_flag_scan(keep, warp_counts, &kept_total);
    if (keep) kept[pos] = (uint32_t)i;
    eq_so_far += eq_total;
    kept_so_far += kept_total;
  }
  __syncthreads();  // kept[] (global, this block's own) is visible to the whole block

  // ---- 3. the scale, in double, in index order ----
  if (tid == 0) {
    if (nonfinite) *bad = 1;
    double ss = 0.0;
    for (int j = 0; j < kc; j++) {
      const double v = (double)xc[kept[j]];
      ss = __dadd_rn(ss, __dmul_rn(v, v));
    }
    const double sigma = __dsqrt_rn(__ddiv_rn(ss, (double)kc));
    float w = __double2float_rn(__dmul_rn(sigma, sh.w_factor));
    float inv = __fdiv_rn(1.0f, w);
    if (!(fabsf(inv) <= FLT_MAX)) w = inv = 0.0f;  // zero chunk: every code L_b/2
    s_w = w;
    s_inv = inv;
  }
  __syncthreads();

  // ---- 4. the record: w, the packed indices, the packed codes ----
  const float w = s_w, inv = s_inv;
  const bool zero = w == 0.0f;
  const int half = 1 << (sh.bits - 1);
  const float lo_code = -(float)half, hi_code = (float)(half - 1);
  const uint32_t wbits = __float_as_uint(w);
  if (tid < 4) record[tid] = (uint8_t)(wbits >> (8 * tid));  // records need not be 4-byte aligned
  const size_t index_bytes = ((size_t)kc * sh.index_bits + 7) / 8;
  const size_t code_bytes = ((size_t)kc * sh.bits + 7) / 8;
  uint8_t* idx_out = record + 4;
  uint8_t* code_out = idx_out + index_bytes;
  for (size_t k = tid; k < index_bytes; k += kThreads)
    idx_out[k] = packed_byte(k, kc, sh.index_bits, [&](int j) { return kept[j]; });
  for (size_t k = tid; k < code_bytes; k += kThreads) {
    code_out[k] = packed_byte(k, kc, sh.bits, [&](int j) -> uint32_t {
      if (zero) return (uint32_t)half;
      const float u = floorf(__fmul_rn(xc[kept[j]], inv));
      return (uint32_t)((int)fmaxf(fminf(u, hi_code), lo_code) + half);
    });
  }
}

}  // namespace

size_t sparse_encode_scratch_words(size_t n, size_t chunk, size_t keep) {
  if (n == 0 || chunk == 0) return 0;
  return (n + chunk - 1) / chunk * diloco::sparse_keep_of(chunk, chunk, keep);
}

void sparse_encode(uint8_t* records, uint32_t* scratch, int* bad, const float* x, size_t n, size_t chunk, size_t keep,
                   int bits, Stream stream) {
  DL_CHECK(chunk >= 2 && chunk <= (size_t{1} << 20), "sparse_encode chunk %zu: use 2..2^20", chunk);
  DL_CHECK(keep >= 1 && keep <= chunk, "sparse_encode keep %zu of a chunk of %zu: use 1..chunk", keep, chunk);
  DL_CHECK(bits == 2 || bits == 4 || bits == 8, "sparse_encode bits %d: use 2, 4 or 8", bits);
  cudaStream_t s = as_cuda(stream);
  CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), s));
  if (n == 0) return;
  SparseShape sh;
  sh.n = n;
  sh.chunk = (int)chunk;
  sh.kc_full = (int)diloco::sparse_keep_of(chunk, chunk, keep);
  const size_t rest = n % chunk;
  sh.kc_last = rest == 0 ? sh.kc_full : (int)diloco::sparse_keep_of(rest, chunk, keep);
  sh.record_full = diloco::sparse_record_bytes(sh.kc_full, chunk, bits);
  sh.index_bits = diloco::sparse_index_bits(chunk);
  sh.bits = bits;
  sh.w_factor = 2.0 * kSparseRange / (double)(1 << bits);
  const size_t chunks = (n + chunk - 1) / chunk;
  DL_CHECK(chunks <= 0x7fffffffu, "sparse_encode: %zu chunks is more than one launch takes", chunks);
  sparse_encode_kernel<<<(unsigned)chunks, kThreads, 0, s>>>(records, scratch, bad, x, sh);
  CUDA_CHECK_LAUNCH();
}

}  // namespace diloco::cuda
