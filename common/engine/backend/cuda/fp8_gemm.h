#pragma once

// The FP8 tensor-core GEMM over fp8 e4m3 weights (W8A8, as vLLM and SGLang serve fp8 checkpoints
// on Hopper): the products of more than kGemvMaxRows rows over fp8 weights on devices of compute
// capability 8.9 and above (gemm.h says when Gemm takes it). For y[M, N] = x[M, K] W[N, K]^T:
//   1. QuantizeActivationsFp8 (quant_kernels.h): dynamic per-token scales sx[m] = max|x[m, :]| /
//      448 and codes qx[m, k] = e4m3(x[m, k] / sx[m]) into this class's scratch;
//   2. cublasLtMatmul with A = the weight codes qw (e4m3, [N, K] row-major: K-major, transposed)
//      and B = qx (e4m3, K-major, not transposed; the "TN" layout FP8 requires), f32 accumulation
//      (CUBLAS_COMPUTE_32F, without fast accumulation), f32 output y;
//   3. the scales: y[m, n] = (sw[n] sx[m]) sum_k e4m3(qw[n, k]) e4m3(qx[m, k]), sw the weight's
//      per-channel (per output row) scales. On sm_90 cuBLASLt applies them itself
//      (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F for A and B, which cuBLAS documents for sm_90
//      only); elsewhere (sm_89, sm_100 and later, where cuBLASLt's FP8 scales are scalars or
//      block scales) the product runs with unit scales and ScaleRowsColumns scales its rows and
//      columns after it (Fp8ScaleMode::kEpilogue): one more pass over y.
// The product differs from the weight-only path (quant_kernels.h) by the activation's rounding
// to e4m3 (a relative 2^-4 per element at most, random in sign) and the accumulation order.
// Products that do not fit cuBLASLt's FP8 requirements (K a multiple of 16, 16-byte aligned
// operands and row strides) or the scratch stay on the weight-only path (Takes).

#include <array>
#include <cstdint>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "common/cuda/cuda_api.h"
#include "common/engine/backend/cuda/cuda_backend.h"
#include "common/engine/backend/cuda/cuda_util.h"
#include "common/engine/backend/cuda/gemm.h"

namespace tandem::cuda {

enum class Fp8ScaleMode : uint8_t {
  kOuterVector,  // cuBLASLt's outer-vector scales (sm_90)
  kEpilogue,     // unit scales in cuBLASLt, then ScaleRowsColumns
};

// The scale mode of a device of compute capability major.minor; nullopt below 8.9 (no FP8
// tensor cores).
std::optional<Fp8ScaleMode> Fp8ScaleModeFor(int major, int minor);

// Enables `gemm`'s FP8 GEMM (Gemm::EnableFp8) when options.fp8_gemm asks for it and it applies:
// `model`'s weights fp8, options.bf16_activations (the f32 parity mode keeps the weight-only
// path, which follows the CPU backend), a device of compute capability 8.9 or above, and
// cuBLASLt has an algorithm for the model's shapes. Otherwise `gemm` keeps the weight-only path,
// except under Fp8GemmMode::kOn, which refuses with one line naming what is missing.
absl::Status SetUpFp8Gemm(const CudaBackendOptions& options, const Model& model, Gemm& gemm);

class Fp8Gemm {
 public:
  Fp8Gemm() = default;
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // Creates the cuBLASLt handle and the matmul descriptor. The workspace is shared with cuBLAS
  // (both run in order on `stream`).
  absl::Status Init(cudaStream_t stream, Fp8ScaleMode mode, void* workspace,
                    size_t workspace_bytes);

  // Scratch of the quantized activations for up to `rows` rows of up to `k` elements; grows,
  // never shrinks. The caller makes sure no product in flight uses the old scratch (and
  // re-captures graphs holding it).
  absl::Status Reserve(int64_t rows, int64_t k);

  // OK when cuBLASLt has an algorithm for [rows, k] x [n, k]^T with this mode on this device;
  // otherwise why not (the startup check).
  absl::Status Probe(int64_t rows, int64_t n, int64_t k);

  // Whether Run takes this product: fp8 weights, K a multiple of 16, 16-byte aligned codes,
  // scales and y, ldy a multiple of 4, M rows within the scratch.
  bool Takes(int64_t M, const DeviceMatrix& w, const float* y, int64_t ldy) const;

  // y (f32, row stride ldy) = x W^T as above; Takes(M, w, y, ldy) must hold.
  absl::Status Run(const GemmInput& x, int64_t M, const DeviceMatrix& w, float* y, int64_t ldy);

  Fp8ScaleMode mode() const { return mode_; }
  int64_t calls() const { return calls_; }

 private:
  // Layouts and the algorithm of one problem shape (M, N, K, ldy), found once.
  struct Plan {
    cublasLtMatrixLayout_t a = nullptr;
    cublasLtMatrixLayout_t b = nullptr;
    cublasLtMatrixLayout_t d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  absl::Status PlanFor(int64_t M, int64_t N, int64_t K, int64_t ldy, const Plan** plan);

  cudaStream_t stream_ = nullptr;
  Fp8ScaleMode mode_ = Fp8ScaleMode::kEpilogue;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  DeviceBuffer scratch_;  // codes [rows_, k_], then scales [rows_]
  uint8_t* codes_ = nullptr;
  float* scales_ = nullptr;
  int64_t rows_ = 0;
  int64_t k_ = 0;
  std::map<std::array<int64_t, 4>, Plan> plans_;
  int64_t calls_ = 0;
};

}  // namespace tandem::cuda
