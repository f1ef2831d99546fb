#include "common/engine/backend/cuda/fp8_gemm.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/quant_kernels.h"

namespace tandem::cuda {
namespace {

bool Fp8Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class T>
cublasStatus_t Fp8SetDescAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                   const T& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value);
}

}  // namespace

std::optional<Fp8ScaleMode> Fp8ScaleModeFor(int major, int minor) {
  if (major * 10 + minor < 89) return std::nullopt;
  return major == 9 ? Fp8ScaleMode::kOuterVector : Fp8ScaleMode::kEpilogue;
}

absl::Status SetUpFp8Gemm(const CudaBackendOptions& options, const Model& model, Gemm& gemm) {
  if (options.fp8_gemm == Fp8GemmMode::kOff || model.quantization() != WeightQuant::kFp8) {
    if (options.fp8_gemm != Fp8GemmMode::kOn) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("the FP8 GEMM (fp8_gemm on) needs fp8 weights (--quantization fp8 or an fp8 "
                     "checkpoint); this model's are ",
                     std::string(WeightQuantName(model.quantization()))));
  }
  const bool required = options.fp8_gemm == Fp8GemmMode::kOn;
  if (!options.bf16_activations) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "the FP8 GEMM (fp8_gemm on) quantizes activations to fp8; the f32 parity mode "
        "(--matmul-input-dtype f32) keeps them exact: choose one");
  }
  int major = 0, minor = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options.device),
      "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, options.device),
      "cudaDeviceGetAttribute(ComputeCapabilityMinor)");
  const std::optional<Fp8ScaleMode> mode = Fp8ScaleModeFor(major, minor);
  if (!mode.has_value()) {
    if (!required) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("the FP8 GEMM (fp8_gemm on) needs FP8 tensor cores (compute capability 8.9 "
                     "or above); this device is sm_",
                     major, minor));
  }
  // One product of the model's shapes (the hidden size both ways): no algorithm means none of
  // them would run. Outer-vector scales that find none fall back to unit scales + the epilogue.
  const int64_t d = model.config().hidden_size;
  auto enable = [&](Fp8ScaleMode m) {
    absl::Status st = gemm.EnableFp8(m);
    return st.ok() ? gemm.fp8()->Probe(2 * kGemvMaxRows, d, d) : st;
  };
  absl::Status st = enable(*mode);
  if (!st.ok() && *mode == Fp8ScaleMode::kOuterVector) {
    TLOG(WARNING) << "the FP8 GEMM scales in an epilogue kernel: cuBLASLt's outer-vector scales "
                     "cannot run here: "
                  << st;
    st = enable(Fp8ScaleMode::kEpilogue);
  }
  if (st.ok()) return absl::OkStatus();
  if (required) {
    return absl::FailedPreconditionError(
        absl::StrCat("the FP8 GEMM (fp8_gemm on) cannot run here: ", st.message()));
  }
  TLOG(WARNING) << "fp8 weights take the weight-only path: the FP8 GEMM cannot run here: " << st;
  gemm.DisableFp8();
  return absl::OkStatus();
}

Fp8Gemm::~Fp8Gemm() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
  }
  if (pref_ != nullptr) cublasLtMatmulPreferenceDestroy(pref_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

absl::Status Fp8Gemm::Init(cudaStream_t stream, Fp8ScaleMode mode, void* workspace,
                           size_t workspace_bytes) {
  stream_ = stream;
  mode_ = mode;
  workspace_ = workspace;
  workspace_bytes_ = workspace_bytes;
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle_), "cublasLtCreate");
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                "cublasLtMatmulDescCreate");
  const int32_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  TANDEM_CUBLAS_RETURN_IF_ERROR(Fp8SetDescAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, transa),
                                "cuBLASLt TRANSA");
  TANDEM_CUBLAS_RETURN_IF_ERROR(Fp8SetDescAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, transb),
                                "cuBLASLt TRANSB");
  if (mode_ == Fp8ScaleMode::kOuterVector) {
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    TANDEM_CUBLAS_RETURN_IF_ERROR(
        Fp8SetDescAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer),
        "cuBLASLt A_SCALE_MODE");
    TANDEM_CUBLAS_RETURN_IF_ERROR(
        Fp8SetDescAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer),
        "cuBLASLt B_SCALE_MODE");
  }
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref_),
                                "cublasLtMatmulPreferenceCreate");
  const uint64_t max_workspace = workspace_bytes_;
  TANDEM_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &max_workspace, sizeof max_workspace),
      "cuBLASLt MAX_WORKSPACE_BYTES");
  return absl::OkStatus();
}

absl::Status Fp8Gemm::Reserve(int64_t rows, int64_t k) {
  if (rows <= rows_ && k <= k_) return absl::OkStatus();
  rows = std::max(rows, rows_);
  k = std::max(k, k_);
  const size_t code_bytes = AlignUp256(static_cast<size_t>(rows * k));
  TANDEM_RETURN_IF_ERROR(scratch_.Allocate(code_bytes + static_cast<size_t>(rows) * sizeof(float),
                                           "fp8 activation scratch"));
  codes_ = scratch_.as<uint8_t>();
  scales_ = reinterpret_cast<float*>(scratch_.as<uint8_t>() + code_bytes);
  rows_ = rows;
  k_ = k;
  return absl::OkStatus();
}

// Column-major, as cuBLASLt sees the row-major operands: A = W is [K, N] with ld K (transposed
// by the operation), B = qx is [K, M] with ld K, D = y^T is [N, M] with ld ldy.
absl::Status Fp8Gemm::PlanFor(int64_t M, int64_t N, int64_t K, int64_t ldy, const Plan** out) {
  const std::array<int64_t, 4> key = {M, N, K, ldy};
  if (auto it = plans_.find(key); it != plans_.end()) {
    *out = &it->second;
    return absl::OkStatus();
  }
  Plan plan;
  auto destroy = [&plan] {
    if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.d != nullptr) cublasLtMatrixLayoutDestroy(plan.d);
  };
  cublasStatus_t st = cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, K, N, K);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, K, M, K);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&plan.d, CUDA_R_32F, N, M, ldy);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, plan.a, plan.b, plan.d, plan.d, pref_, 1,
                                        &result, &found);
  }
  if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (st != CUBLAS_STATUS_SUCCESS) {
    destroy();
    return CublasStatus(
        st,
        absl::StrCat("cuBLASLt FP8 GEMM [", M, " x ", K, "] x [", K, " x ", N, "] (",
                     mode_ == Fp8ScaleMode::kOuterVector ? "outer-vector scales" : "unit scales",
                     "): no algorithm"));
  }
  plan.algo = result.algo;
  *out = &plans_.emplace(key, plan).first->second;
  return absl::OkStatus();
}

absl::Status Fp8Gemm::Probe(int64_t rows, int64_t n, int64_t k) {
  const Plan* plan = nullptr;
  return PlanFor(rows, n, k, n + (4 - n % 4) % 4, &plan);
}

bool Fp8Gemm::Takes(int64_t M, const DeviceMatrix& w, const float* y, int64_t ldy) const {
  return handle_ != nullptr && w.quant == WeightQuant::kFp8 && M <= rows_ && w.cols <= k_ &&
         w.cols % 16 == 0 && ldy % 4 == 0 && Fp8Aligned16(w.data) && Fp8Aligned16(w.scales) &&
         Fp8Aligned16(y);
}

absl::Status Fp8Gemm::Run(const GemmInput& x, int64_t M, const DeviceMatrix& w, float* y,
                          int64_t ldy) {
  const int64_t N = w.rows, K = w.cols;
  ++calls_;
  TANDEM_CUDA_RETURN_IF_ERROR(
      QuantizeActivationsFp8(x.data, x.bf16, x.ld, M, K, codes_, scales_, stream_),
      "QuantizeActivationsFp8 kernel");
  if (mode_ == Fp8ScaleMode::kOuterVector) {
    const void* a_scale = w.scales;
    const void* b_scale = scales_;
    TANDEM_CUBLAS_RETURN_IF_ERROR(
        Fp8SetDescAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale),
        "cuBLASLt A_SCALE_POINTER");
    TANDEM_CUBLAS_RETURN_IF_ERROR(
        Fp8SetDescAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale),
        "cuBLASLt B_SCALE_POINTER");
  }
  const Plan* plan = nullptr;
  TANDEM_RETURN_IF_ERROR(PlanFor(M, N, K, ldy, &plan));
  const float alpha = 1.0f, beta = 0.0f;
  TANDEM_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmul(handle_, desc_, &alpha, w.data, plan->a, codes_, plan->b, &beta, y, plan->d, y,
                     plan->d, &plan->algo, workspace_, workspace_bytes_, stream_),
      absl::StrCat("cublasLtMatmul fp8 [", M, " x ", K, "] x [", K, " x ", N, "]"));
  if (mode_ == Fp8ScaleMode::kEpilogue) {
    TANDEM_CUDA_RETURN_IF_ERROR(ScaleRowsColumns(y, ldy, M, N, scales_, w.scales, stream_),
                                "ScaleRowsColumns kernel");
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda
