#pragma once

// Host stand-ins for the cuBLASLt calls of the FP8 GEMM (common/engine/backend/cuda/fp8_gemm.cc),
// with the real names, values and signatures of <cublasLt.h>, for the emulation build
// (TANDEM_CUDA_EMULATION). cublasLtMatmul computes what the real call computes, as a reference:
// D = alpha * scale * sum_l op(A)[i, l] * op(B)[l, j] (+ beta * C), each e4m3 element decoded
// exactly, the exact products summed in f32 in order of l, scale = scaleA * scaleB (f32) where
// each is the matrix's scalar (SCALAR_32F: the pointed f32, 1 without a pointer) or its vector's
// element (OUTER_VEC_32F: A's element i, B's element j). It accepts only what the FP8 GEMM uses
// and what cuBLASLt's documentation says the device runs, so a call the real library would refuse
// fails here too (CUBLAS_STATUS_NOT_SUPPORTED or CUBLAS_STATUS_INVALID_VALUE):
//   - A and B CUDA_R_8F_E4M3, C and D CUDA_R_32F, CUBLAS_COMPUTE_32F with CUDA_R_32F scales, on a
//     device of compute capability 8.9 or above (cuda_emu::SetComputeCapability; FP8 tensor
//     cores);
//   - A transposed and B not ("TN", what FP8 requires on sm_89 / sm_90 / sm_120);
//   - leading dimensions and pointers 16-byte aligned (A, B, D, and the scale vectors);
//   - OUTER_VEC_32F scales only on compute capability 9.x (cuBLAS documents them for sm_90 only).
// cublasLtMatmulAlgoGetHeuristic returns one algorithm for a supported problem (the same checks,
// pointers aside), none (CUBLAS_STATUS_NOT_SUPPORTED) otherwise.

#include <cstddef>
#include <cstdint>

#include "common/cuda/emulation/fake_cuda.h"

struct cublasLtContext;
typedef cublasLtContext* cublasLtHandle_t;
struct cublasLtMatmulDescOpaque_t;
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
struct cublasLtMatrixLayoutOpaque_t;
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
struct cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
  CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
  CUBLASLT_MATMUL_DESC_FAST_ACCUM = 25,
  CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,
  CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32,
} cublasLtMatmulDescAttributes_t;

typedef enum {
  CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0,
  CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3,
} cublasLtMatmulMatrixScale_t;

typedef enum { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 } cublasLtMatmulPreferenceAttributes_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
// Only the attributes listed above; the value's size must be the real one (4 bytes for the
// operations, modes and flags, a pointer's for the scale pointers).
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size);
// Column-major rows x cols with leading dimension ld (>= rows).
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned);
// Runs in `stream`'s order (recorded when the stream is capturing). C may be D (in place).
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream);

namespace tandem::cuda_emu {
// cublasLtMatmul calls since the process started (tests).
int64_t CublasLtMatmuls();
}  // namespace tandem::cuda_emu
