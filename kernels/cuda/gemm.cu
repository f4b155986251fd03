// cuBLASLt GEMMs for the linear layers. Row-major (N,C) activations and
// (OC,C) weights are column-major (C,N) and (C,OC) to cuBLAS, so:
//   forward   out^T (OC,N)  = W^T'(OC,C) x inp^T (C,N)     transa = T
//   dinp      dinp^T (C,N)  = W (C,OC) x dout^T (OC,N)
//   dweight   dW^T (C,OC)  += inp^T (C,N) x dout (N,OC)    transb = T, beta = 1
// Heuristic results are cached per shape, types, epilogue and pointer
// alignment. cuBLASLt is run-to-run deterministic for a fixed algorithm
// on the same GPU (its split-K reductions are sequenced, not atomic).
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <map>
#include <tuple>

#include "kernels/cuda/common.cuh"

#define CUBLAS_CHECK(expr)                                                                        \
  do {                                                                                            \
    const cublasStatus_t st_ = (expr);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      std::fprintf(stderr, "%s:%d: cuBLASLt error %d (in %s)\n", __FILE__, __LINE__, (int)st_, #expr); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

namespace diloco::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // what cuBLASLt asks for on Hopper

int alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

enum class Epilogue { kNone, kBias, kGeluAuxBias, kGeluAux };

cublasLtEpilogue_t to_cublas(Epilogue e) {
  switch (e) {
    case Epilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::kNone: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// One column-major GEMM: D (m,n) = alpha op(A) op(B) + beta C, C == D.
struct GemmCall {
  int m, n, k;
  bool trans_a, trans_b;
  const bf16* A;
  int lda;
  const bf16* B;
  int ldb;
  void* D;
  int ldd;
  bool d_fp32;
  float beta;
  Epilogue epilogue = Epilogue::kNone;
  const bf16* bias = nullptr;
  bf16* aux = nullptr;  // pre-GELU values, ld = ldd
};

// The fallback for a GEMM cuBLASLt has no algorithm for (odd leading
// dimensions of tiny test models, unusual alignments): one thread per
// output, fp32 accumulation in k order. Slow, correct, deterministic.
__global__ void naive_gemm_kernel(GemmCall c) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // row of D
  if (i >= c.m) return;
  const nv_bf16* A = reinterpret_cast<const nv_bf16*>(c.A);
  const nv_bf16* B = reinterpret_cast<const nv_bf16*>(c.B);
  for (int j = blockIdx.y; j < c.n; j += gridDim.y) {  // columns of D
    float sum = 0.0f;
    for (int k = 0; k < c.k; k++) {
      const float a = to_f(c.trans_a ? A[(size_t)i * c.lda + k] : A[(size_t)k * c.lda + i]);
      const float b = to_f(c.trans_b ? B[(size_t)k * c.ldb + j] : B[(size_t)j * c.ldb + k]);
      sum += a * b;
    }
    const size_t at = (size_t)j * c.ldd + i;
    if (c.d_fp32) {
      float* D = static_cast<float*>(c.D);
      D[at] = sum + (c.beta != 0.0f ? c.beta * D[at] : 0.0f);
    } else {
      nv_bf16* D = static_cast<nv_bf16*>(c.D);
      D[at] = to_bf(sum + (c.beta != 0.0f ? c.beta * to_f(D[at]) : 0.0f));
    }
  }
}

using CacheKey = std::tuple<int, int, int, bool, bool, int, int, int, bool, int, int, int, int, int, int, int, bool>;

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<CacheKey, std::pair<bool, cublasLtMatmulAlgo_t>> cache;  // false: no algorithm for this call
  long fallbacks = 0;

  // Runs the call; returns false (doing nothing) when cuBLASLt has no
  // algorithm for it (an epilogue it does not support for the shape).
  bool run(const GemmCall& c, cudaStream_t stream) {
    const cudaDataType_t dtype = c.d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatmulDesc_t op;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const cublasLtEpilogue_t epi = to_cublas(c.epilogue);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (c.bias) {
      const void* bias = c.bias;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    if (c.aux) {
      void* aux = c.aux;
      const int64_t ld = c.ldd;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    // Stored shapes (before op): A is (m,k) or (k,m) when transposed.
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k, c.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n, c.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dtype, c.m, c.n, c.ldd));

    const CacheKey key{c.m,
                       c.n,
                       c.k,
                       c.trans_a,
                       c.trans_b,
                       c.lda,
                       c.ldb,
                       c.ldd,
                       c.d_fp32,
                       (int)c.epilogue,
                       alignment_of(c.A),
                       alignment_of(c.B),
                       alignment_of(c.D),
                       c.bias ? alignment_of(c.bias) : 0,
                       c.aux ? alignment_of(c.aux) : 0,
                       0,
                       c.beta != 0.0f};
    auto it = cache.find(key);
    if (it == cache.end()) {
      cublasLtMatmulPreference_t pref;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = kWorkspaceBytes;
      CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      const uint32_t al_a = alignment_of(c.A), al_b = alignment_of(c.B), al_d = alignment_of(c.D);
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                        sizeof al_a));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                        sizeof al_b));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                        sizeof al_d));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                        sizeof al_d));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, ld, ld, pref, 1, &result, &found);
      CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
      const bool ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
      it = cache.emplace(key, std::make_pair(ok, result.algo)).first;
    }
    bool ran = false;
    if (it->second.first) {
      const float alpha = 1.0f, beta = c.beta;
      CUBLAS_CHECK(cublasLtMatmul(handle, op, &alpha, c.A, la, c.B, lb, &beta, c.D, ld, c.D, ld, &it->second.second,
                                  workspace, kWorkspaceBytes, stream));
      ran = true;
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
    return ran;
  }

  // Runs the call through cuBLASLt, or the naive kernel when it has no
  // algorithm for it (epilogue must be kNone).
  void must_run(const GemmCall& c, cudaStream_t stream) {
    if (run(c, stream)) return;
    if (!warned_naive) {
      std::fprintf(stderr,
                   "note: cuBLASLt has no algorithm for a bf16 GEMM m=%d n=%d k=%d (lda %d ldb %d ldd %d); "
                   "using the slow fallback kernel for such shapes\n",
                   c.m, c.n, c.k, c.lda, c.ldb, c.ldd);
      warned_naive = true;
    }
    naive_gemms++;
    const dim3 grid((c.m + 127) / 128, c.n < 65535 ? c.n : 65535);
    naive_gemm_kernel<<<grid, 128, 0, stream>>>(c);
    CUDA_CHECK_LAUNCH();
  }
  bool warned_naive = false;
  long naive_gemms = 0;
};

Gemm::Gemm() : impl_(std::make_unique<Impl>()) {
  CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  CUDA_CHECK(cudaMalloc(&impl_->workspace, kWorkspaceBytes));
}

Gemm::~Gemm() {
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

long Gemm::epilogue_fallbacks() const { return impl_->fallbacks; }
long Gemm::naive_fallbacks() const { return impl_->naive_gemms; }

void Gemm::matmul_forward(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight, const bf16* bias, int N,
                          int C, int OC, Stream stream) {
  if (N == 0 || OC == 0) return;
  cudaStream_t s = as_cuda(stream);
  GemmCall c{OC, N, C, true, false, weight, C, inp, C, out, OC, false, 0.0f};
  if (pre_gelu) {
    c.epilogue = bias ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux;
    c.bias = bias;
    c.aux = pre_gelu;
    if (impl_->run(c, s)) return;
    impl_->fallbacks++;
  }
  // Without GELU (or when the fused GELU is not available for this shape):
  // the biased product into pre_gelu or out, then the GELU kernel.
  bf16* dst = pre_gelu ? pre_gelu : out;
  c.D = dst;
  c.aux = nullptr;
  c.epilogue = bias ? Epilogue::kBias : Epilogue::kNone;
  c.bias = bias;
  if (!impl_->run(c, s)) {
    impl_->fallbacks++;
    c.epilogue = Epilogue::kNone;
    c.bias = nullptr;
    impl_->must_run(c, s);
    if (bias) add_bias(dst, bias, N, OC, stream);
  }
  if (pre_gelu) gelu_forward(out, pre_gelu, (size_t)N * OC, stream);
}

void Gemm::matmul_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                           const bf16* inp, const bf16* weight, int N, int C, int OC, Stream stream) {
  if (N == 0) return;
  cudaStream_t s = as_cuda(stream);
  if (dinp) {
    // dinp^T (C,N) = W_cm (C,OC) x dout^T (OC,N)
    impl_->must_run(GemmCall{C, N, OC, false, false, weight, C, dout, OC, dinp, C, false, 0.0f}, s);
  }
  // dW^T (C,OC) += inp^T (C,N) x dout (N,OC): B = dout^T stored (OC,N), transposed.
  impl_->must_run(GemmCall{C, OC, N, false, true, inp, C, dout, OC, dweight, C, true, 1.0f}, s);
  if (dbias) bias_backward(dbias, scratch, dout, N, OC, stream);
}

}  // namespace diloco::cuda
