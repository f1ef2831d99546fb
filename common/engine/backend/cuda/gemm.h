#pragma once

// Matrix products through cuBLAS: y[M, N] = x[M, K] W[N, K]^T (+ bias) with f32 activations and
// f32 or bf16 weights, fp32 accumulation.
//
// f32 weights: one f32 GEMM (CUBLAS_COMPUTE_32F, no TF32), like the CPU kernels' arithmetic.
// bf16 weights: tensor cores need bf16 on both sides, so the activations are converted:
//   kSplit (default): x = hi + lo with hi = bf16(x), lo = bf16(x - hi) (~16 mantissa bits), and
//     y = W hi + W lo. For up to `stack_rows` rows both halves go through one GEMM of 2M columns
//     (the weights are read once, which is what decode steps pay for); above that, two GEMMs
//     accumulate into y. Results stay within ~1e-5 of the f32-activation product, close enough
//     for greedy decoding to follow the CPU backend.
//   kRound: x rounded to bf16 once (one GEMM; ~3 significant digits on activations).

#include <cstdint>

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "common/engine/backend/cuda/cuda_api.h"
#include "common/engine/backend/cuda/cuda_util.h"

namespace tandem::cuda {

// A row-major [rows, cols] weight matrix in device memory.
struct DeviceMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;  // kF32 or kBF16
  int64_t rows = 0;           // N (outputs)
  int64_t cols = 0;           // K (inputs)
};

enum class Bf16Mode { kSplit, kRound };

class Gemm {
 public:
  Gemm() = default;
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Creates the cuBLAS handle on `stream` with a fixed workspace (so that GEMMs can be captured
  // into CUDA graphs).
  absl::Status Init(cudaStream_t stream, Bf16Mode mode);

  // Scratch for bf16 weights: `split` holds split_elems bf16 values (2 M K at most is used), and
  // `stacked` holds [2 * stack_rows, stacked_cols] f32. Owned by the caller.
  void SetScratch(uint16_t* split, int64_t split_elems, float* stacked, int64_t stack_rows,
                  int64_t stacked_cols);

  // y (row stride ldy) = x (row stride ldx) W^T (+ bias when not null).
  absl::Status Run(const float* x, int64_t M, int64_t ldx, const DeviceMatrix& w, const float* bias,
                   float* y, int64_t ldy);

  Bf16Mode mode() const { return mode_; }

 private:
  absl::Status GemmEx(const DeviceMatrix& w, const void* x, bool x_bf16, int64_t ldx,
                      int64_t columns, float* y, int64_t ldy, float beta);

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  Bf16Mode mode_ = Bf16Mode::kSplit;
  uint16_t* split_ = nullptr;
  int64_t split_elems_ = 0;
  float* stacked_ = nullptr;
  int64_t stack_rows_ = 0;
  int64_t stacked_cols_ = 0;
};

}  // namespace tandem::cuda
