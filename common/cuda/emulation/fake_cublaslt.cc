#include "common/cuda/emulation/fake_cublaslt.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/cuda/emulation/emulator.h"
#include "common/cuda/emulation/reference_gemm.h"

struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = CUDA_R_32F;
  int32_t transa = CUBLAS_OP_N;
  int32_t transb = CUBLAS_OP_N;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  int32_t a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  int32_t b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  int32_t fast_accum = 0;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0;
  uint64_t cols = 0;
  int64_t ld = 0;
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace = 0;
};

namespace {

std::atomic<int64_t> g_lt_matmuls{0};

// The value of an e4m3 ("E4M3FN") code, decoded on its own here (not with the project's
// decoder) so the reference is independent: (8 + m) 2^(e - 10) for e > 0, m 2^-9 for e = 0, NaN
// for 0x7f / 0xff.
float E4m3Value(uint8_t c) {
  if ((c & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  const int e = (c >> 3) & 15, m = c & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(static_cast<float>(8 + m), e - 10);
  return (c & 0x80) != 0 ? -mag : mag;
}

// Every code's value, decoded once (the matmul loop looks them up).
const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = E4m3Value(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool ValidMode(int32_t mode) {
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
         mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
}

// The checks of the header, pointers aside: CUBLAS_STATUS_SUCCESS when the device runs the
// problem. m, n, k: D is m x n, the sum runs over k.
cublasStatus_t CheckProblem(const cublasLtMatmulDescOpaque_t& desc,
                            const cublasLtMatrixLayoutOpaque_t& a,
                            const cublasLtMatrixLayoutOpaque_t& b,
                            const cublasLtMatrixLayoutOpaque_t& c,
                            const cublasLtMatrixLayoutOpaque_t& d) {
  const int cc = tandem::cuda_emu::ComputeCapability();
  if (cc < 89 || desc.compute != CUBLAS_COMPUTE_32F || desc.scale_type != CUDA_R_32F ||
      a.type != CUDA_R_8F_E4M3 || b.type != CUDA_R_8F_E4M3 || c.type != CUDA_R_32F ||
      d.type != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (desc.transa != CUBLAS_OP_T || desc.transb != CUBLAS_OP_N) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool outer = desc.a_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F ||
                     desc.b_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  if (outer && cc / 10 != 9) return CUBLAS_STATUS_NOT_SUPPORTED;
  // op(A) = A^T: A is k x m; B is k x n; C and D m x n.
  if (a.rows != b.rows || c.rows != a.cols || c.cols != b.cols || d.rows != c.rows ||
      d.cols != c.cols || a.ld < static_cast<int64_t>(a.rows) ||
      b.ld < static_cast<int64_t>(b.rows) || c.ld < static_cast<int64_t>(c.rows) ||
      d.ld < static_cast<int64_t>(d.rows)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (a.ld % 16 != 0 || b.ld % 16 != 0 || (d.ld * 4) % 16 != 0 || (c.ld * 4) % 16 != 0) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

namespace tandem::cuda_emu {
int64_t CublasLtMatmuls() { return g_lt_matmuls; }
}  // namespace tandem::cuda_emu

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  *desc = new cublasLtMatmulDescOpaque_t();
  (*desc)->compute = compute;
  (*desc)->scale_type = scale_type;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (desc == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto int32 = [&](int32_t* out) {
    if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(out, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  };
  auto pointer = [&](const void** out) {
    if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(out, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return int32(&desc->transa);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return int32(&desc->transb);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
      return pointer(&desc->a_scale);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
      return pointer(&desc->b_scale);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
      return int32(&desc->fast_accum);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: {
      int32_t mode = 0;
      if (int32(&mode) != CUBLAS_STATUS_SUCCESS || !ValidMode(mode)) {
        return CUBLAS_STATUS_INVALID_VALUE;
      }
      (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE ? desc->a_scale_mode : desc->b_scale_mode) = mode;
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (pref == nullptr || attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ||
      size != sizeof(uint64_t)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::memcpy(&pref->max_workspace, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  *returned = 0;
  if (handle == nullptr || desc == nullptr || pref == nullptr || requested < 1) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (const cublasStatus_t st = CheckProblem(*desc, *a, *b, *c, *d); st != CUBLAS_STATUS_SUCCESS) {
    return st;
  }
  std::memset(&results[0], 0, sizeof results[0]);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* /*workspace*/,
                              size_t /*workspace_bytes*/, cudaStream_t stream) {
  if (handle == nullptr || desc == nullptr || algo == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (const cublasStatus_t st = CheckProblem(*desc, *a, *b, *c, *d); st != CUBLAS_STATUS_SUCCESS) {
    return st;
  }
  const bool a_outer = desc->a_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const bool b_outer = desc->b_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  if (!Aligned16(A) || !Aligned16(B) || !Aligned16(D) || !Aligned16(C) ||
      (a_outer && (desc->a_scale == nullptr || !Aligned16(desc->a_scale))) ||
      (b_outer && (desc->b_scale == nullptr || !Aligned16(desc->b_scale)))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  ++g_lt_matmuls;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const auto* sa = static_cast<const float*>(desc->a_scale);
  const auto* sb = static_cast<const float*>(desc->b_scale);
  const int64_t m = static_cast<int64_t>(d->rows), n = static_cast<int64_t>(d->cols);
  const int64_t k = static_cast<int64_t>(a->rows), lda = a->ld, ldb = b->ld, ldc = c->ld,
                ldd = d->ld;
  tandem::cuda_emu::EnqueueOnStream(stream, [=] {
    const std::array<float, 256>& value = E4m3Table();
    const auto* qa = static_cast<const uint8_t*>(A);
    const auto* qb = static_cast<const uint8_t*>(B);
    const auto* cin = static_cast<const float*>(C);
    auto* out = static_cast<float*>(D);
    // Each product is exact in f32 (4 + 4 significant bits); the sums are f32, in order.
    tandem::cuda_emu::ReferenceGemm<float>(
        m, n, k, [&](int64_t i, int64_t l) { return value[qa[l + i * lda]]; },
        [&](int64_t l, int64_t j) { return value[qb[l + j * ldb]]; },
        [&](int64_t i, int64_t j, float acc) {
          const float s = (sa == nullptr ? 1.0f : sa[a_outer ? i : 0]) *
                          (sb == nullptr ? 1.0f : sb[b_outer ? j : 0]);
          float v = al * s * acc;
          if (be != 0.0f) v += be * cin[i + j * ldc];
          out[i + j * ldd] = v;
        });
  });
  return CUBLAS_STATUS_SUCCESS;
}
