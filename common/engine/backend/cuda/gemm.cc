#include "common/engine/backend/cuda/gemm.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/engine/backend/cuda/fp8_gemm.h"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/quant_kernels.h"

namespace tandem::cuda {
namespace {

// cuBLAS asks for a user workspace when GEMMs are captured into graphs; 32 MiB covers Hopper.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

}  // namespace

Gemm::Gemm() = default;

Gemm::~Gemm() {
  fp8_.reset();
  if (handle_ != nullptr) cublasDestroy(handle_);
}

absl::Status Gemm::EnableFp8(Fp8ScaleMode mode) {
  auto fp8 = std::make_unique<Fp8Gemm>();
  TANDEM_RETURN_IF_ERROR(fp8->Init(stream_, mode, workspace_.get(), workspace_.bytes()));
  fp8_ = std::move(fp8);
  return absl::OkStatus();
}

void Gemm::DisableFp8() { fp8_.reset(); }

absl::Status Gemm::ReserveFp8(int64_t rows, int64_t k) {
  return fp8_ == nullptr ? absl::OkStatus() : fp8_->Reserve(rows, k);
}

int64_t Gemm::fp8_calls() const { return fp8_ == nullptr ? 0 : fp8_->calls(); }

absl::Status Gemm::Init(cudaStream_t stream) {
  stream_ = stream;
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle_), "cublasCreate");
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, stream), "cublasSetStream");
  if (auto st = workspace_.Allocate(kCublasWorkspaceBytes, "cuBLAS workspace"); !st.ok()) return st;
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(handle_, workspace_.get(), workspace_.bytes()),
                                "cublasSetWorkspace");
  return absl::OkStatus();
}

void Gemm::SetScratch(uint16_t* split, int64_t split_elems, float* stacked, int64_t stack_rows,
                      int64_t stacked_cols) {
  split_ = split;
  split_elems_ = split_elems;
  stacked_ = stacked;
  stack_rows_ = stack_rows;
  stacked_cols_ = stacked_cols;
}

// Row-major y[M, N] = x[M, K] W[N, K]^T is column-major y^T[N, M] = W^T' x^T' where W (row-major
// [N, K]) is column-major [K, N] with ld K, transposed; x (row-major, stride ldx) is column-major
// [K, M] with ld ldx; y^T is column-major [N, M] with ld ldy.
absl::Status Gemm::GemmEx(const DeviceMatrix& w, const void* x, bool x_bf16, int64_t ldx,
                          int64_t columns, float* y, int64_t ldy, float beta) {
  const float alpha = 1.0f;
  const cudaDataType_t wtype = w.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t xtype = x_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  ++cublas_calls_;
  TANDEM_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows),
                   static_cast<int>(columns), static_cast<int>(w.cols), &alpha, w.data, wtype,
                   static_cast<int>(w.cols), x, xtype, static_cast<int>(ldx), &beta, y, CUDA_R_32F,
                   static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      absl::StrCat("cublasGemmEx [", columns, " x ", w.cols, "] x [", w.cols, " x ", w.rows, "]"));
  return absl::OkStatus();
}

bool Gemm::UseGemv(int64_t M, const DeviceMatrix& w) const {
  return (w.dtype == DType::kBF16 || w.quant != WeightQuant::kNone) && M <= kGemvMaxRows;
}

absl::Status Gemm::RunGemv(const GemmInput& x, int64_t M, const DeviceMatrix& w, void* y,
                           int64_t ldy, bool y_bf16, bool silu_mul) {
  if (w.quant != WeightQuant::kNone) return RunQuantGemv(x, M, w, y, ldy, y_bf16, silu_mul);
  GemvArgs a;
  a.x = x.data;
  a.ldx = x.ld;
  a.x_bf16 = x.bf16;
  a.rows = static_cast<int32_t>(M);
  a.w = static_cast<const uint16_t*>(w.data);
  a.n = silu_mul ? w.rows / 2 : w.rows;
  a.k = w.cols;
  a.y = y;
  a.ldy = ldy;
  a.y_bf16 = y_bf16;
  a.silu_mul = silu_mul;
  ++gemv_calls_;
  TANDEM_CUDA_RETURN_IF_ERROR(Gemv(a, stream_), "Gemv kernel");
  return absl::OkStatus();
}

absl::Status Gemm::RunQuantGemv(const GemmInput& x, int64_t M, const DeviceMatrix& w, void* y,
                                int64_t ldy, bool y_bf16, bool silu_mul) {
  QuantGemvArgs a;
  a.x = x.data;
  a.ldx = x.ld;
  a.x_bf16 = x.bf16;
  a.rows = static_cast<int32_t>(M);
  a.quant = w.quant;
  a.codes = static_cast<const uint8_t*>(w.data);
  a.scales = w.scales;
  a.group_size = w.group_size;
  a.n = silu_mul ? w.rows / 2 : w.rows;
  a.k = w.cols;
  a.y = y;
  a.ldy = ldy;
  a.y_bf16 = y_bf16;
  a.silu_mul = silu_mul;
  ++gemv_calls_;
  TANDEM_CUDA_RETURN_IF_ERROR(QuantGemv(a, stream_), "QuantGemv kernel");
  return absl::OkStatus();
}

absl::Status Gemm::RunDequantized(const GemmInput& x, int64_t M, const DeviceMatrix& w, float* y,
                                  int64_t ldy) {
  const int64_t K = w.cols, N = w.rows;
  const int64_t elem = x.bf16 ? 2 : 4;
  const int64_t tile_rows = std::min<int64_t>(N, w.dequant_bytes / (elem * K));
  if (w.dequant == nullptr || tile_rows < 1) {
    return absl::InternalError(absl::StrCat("no dequantization scratch for a [", N, ", ", K,
                                            "] quantized matrix (", w.dequant_bytes, " bytes)"));
  }
  for (int64_t n0 = 0; n0 < N; n0 += tile_rows) {
    const int64_t nr = std::min(tile_rows, N - n0);
    TANDEM_CUDA_RETURN_IF_ERROR(
        DequantizeRows(w.quant, static_cast<const uint8_t*>(w.data), w.scales, w.group_size, K, n0,
                       nr, w.dequant, x.bf16, stream_),
        "DequantizeRows kernel");
    const DeviceMatrix tile{w.dequant, x.bf16 ? DType::kBF16 : DType::kF32, nr, K};
    if (auto st = GemmEx(tile, x.data, x.bf16, x.ld, M, y + n0, ldy, 0.0f); !st.ok()) return st;
    if (w.quant == WeightQuant::kInt8 || w.quant == WeightQuant::kFp8) {
      TANDEM_CUDA_RETURN_IF_ERROR(ScaleColumns(y + n0, ldy, M, nr, w.scales + n0, stream_),
                                  "ScaleColumns kernel");
    }
  }
  return absl::OkStatus();
}

absl::Status Gemm::Run(const GemmInput& x, int64_t M, const DeviceMatrix& w, float* y,
                       int64_t ldy) {
  if (M == 0) return absl::OkStatus();
  const int64_t K = w.cols, N = w.rows;
  if (w.quant != WeightQuant::kNone) {
    if (UseGemv(M, w)) return RunGemv(x, M, w, y, ldy, false, false);
    if (fp8_ != nullptr && fp8_->Takes(M, w, y, ldy)) return fp8_->Run(x, M, w, y, ldy);
    return RunDequantized(x, M, w, y, ldy);
  }
  if (w.dtype == DType::kF32) {
    if (x.bf16) return absl::InvalidArgumentError("f32 weights take f32 activations");
    return GemmEx(w, x.data, false, x.ld, M, y, ldy, 0.0f);
  }
  if (w.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("CUDA matmul weights must be f32 or bf16");
  }
  if (UseGemv(M, w)) return RunGemv(x, M, w, y, ldy, false, false);
  if (x.bf16) return GemmEx(w, x.data, true, x.ld, M, y, ldy, 0.0f);
  if (2 * M * K > split_elems_) {
    return absl::InternalError(absl::StrCat("matmul scratch too small for ", M, " rows of ", K));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(
      SplitToBf16(static_cast<const float*>(x.data), M, K, x.ld, true, split_, stream_),
      "SplitToBf16 kernel");
  if (M <= stack_rows_ && N <= stacked_cols_) {
    if (auto st = GemmEx(w, split_, true, K, 2 * M, stacked_, N, 0.0f); !st.ok()) return st;
    TANDEM_CUDA_RETURN_IF_ERROR(CombineSplit(stacked_, M, N, y, ldy, stream_),
                                "CombineSplit kernel");
    return absl::OkStatus();
  }
  if (auto st = GemmEx(w, split_, true, K, M, y, ldy, 0.0f); !st.ok()) return st;
  return GemmEx(w, split_ + M * K, true, K, M, y, ldy, 1.0f);
}

absl::Status Gemm::RunSiluMul(const GemmInput& x, int64_t M, const DeviceMatrix& w, float* scratch,
                              void* out, bool out_bf16) {
  if (M == 0) return absl::OkStatus();
  const int64_t F = w.rows / 2;
  if (UseGemv(M, w)) return RunGemv(x, M, w, out, F, out_bf16, true);
  if (auto st = Run(x, M, w, scratch, 2 * F); !st.ok()) return st;
  TANDEM_CUDA_RETURN_IF_ERROR(SiluMul(scratch, 2 * F, M, F, out, out_bf16, stream_),
                              "SiluMul kernel");
  return absl::OkStatus();
}

}  // namespace tandem::cuda
