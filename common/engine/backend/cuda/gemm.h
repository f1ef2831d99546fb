#pragma once

// Matrix products of the forward pass: y[M, N] = x[M, K] W[N, K]^T with fp32 accumulation, f32
// or bf16 weights and f32 or bf16 activations. Which kernel runs:
//   bf16 weights, M <= kGemvMaxRows: the GEMV (gemv_kernels.cu), each weight row streamed once
//     for every row of x, f32 or bf16 x as given (f32 x is multiplied exactly as f32);
//   bf16 weights, bf16 x: one cuBLAS bf16 GEMM (tensor cores);
//   bf16 weights, f32 x (the parity mode's prefill): tensor cores need bf16 on both sides, so x
//     is split into hi = bf16(x) and lo = bf16(x - hi) (~16 mantissa bits) and y = W hi + W lo;
//     up to `stack_rows` rows both halves go through one GEMM of 2M columns (weights read once),
//     above that two GEMMs accumulate. Within ~1e-5 of the f32-activation product;
//   f32 weights (f32 x): one f32 GEMM (CUBLAS_COMPUTE_32F, no TF32), the CPU kernels' arithmetic;
//   int8 / int4 weights (quant_kernels.h for layout and arithmetic), M <= kGemvMaxRows: the
//     quantized GEMV (quant_gemv_kernels.cu), codes streamed once for every row of x;
//   fp8 weights, more rows, with the FP8 GEMM enabled (EnableFp8: a device of compute capability
//     8.9 or above) and a product it takes (Fp8Gemm::Takes): activations quantized to e4m3 per
//     token and one cuBLASLt FP8 tensor-core GEMM (fp8_gemm.h);
//   int8 / int4 / fp8 weights, more rows: tiles of weight rows are dequantized into the matrix's
//     `dequant` scratch (bf16 for bf16 x, f32 for f32 x) and multiplied by cuBLAS as dense
//     weights, tile by tile into y's columns (int8: the tile's columns then scaled by the row
//     scales). The scratch is shared by all of a model's quantized matrices (products run in
//     stream order).
// Bias and SiLU live in the kernels around the products (RopeWriteKv, the GEMV epilogue or
// SiluMul), not here.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "common/base/quant.h"
#include "common/cuda/cuda_api.h"
#include "common/engine/backend/cuda/cuda_util.h"

namespace tandem::cuda {

class Fp8Gemm;
enum class Fp8ScaleMode : uint8_t;

// A row-major [rows, cols] weight matrix in device memory: dense f32 / bf16 elements, or int8 /
// int4 / fp8 codes with their scales (quant != kNone; layout in quant_kernels.h).
struct DeviceMatrix {
  const void* data = nullptr;  // elements, or the codes
  DType dtype = DType::kF32;   // kF32 or kBF16 (quantized: the model's dense dtype)
  int64_t rows = 0;            // N (outputs)
  int64_t cols = 0;            // K (inputs)
  WeightQuant quant = WeightQuant::kNone;
  const float* scales = nullptr;  // int8, fp8: [rows]; int4: [rows, groups, 2] (scale, zero)
  int64_t group_size = 0;         // int4
  // Quantized: scratch of the tiled path (more than kGemvMaxRows rows), dequant_bytes bytes.
  void* dequant = nullptr;
  int64_t dequant_bytes = 0;
};

// Activations fed to a product: rows of f32 or bf16 values, row stride `ld` elements.
struct GemmInput {
  const void* data = nullptr;
  bool bf16 = false;
  int64_t ld = 0;
};

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Creates the cuBLAS handle on `stream` with a fixed workspace (so that GEMMs can be captured
  // into CUDA graphs).
  absl::Status Init(cudaStream_t stream);

  // Scratch of the split path (f32 x, bf16 weights, more than kGemvMaxRows rows): `split` holds
  // split_elems bf16 values (2 M K are used), `stacked` [2 * stack_rows, stacked_cols] f32.
  // Owned by the caller.
  void SetScratch(uint16_t* split, int64_t split_elems, float* stacked, int64_t stack_rows,
                  int64_t stacked_cols);

  // Products of more than kGemvMaxRows rows over fp8 weights take the FP8 GEMM (fp8_gemm.h) from
  // now on, with the given scale mode (after Init). Its cuBLASLt handle shares the workspace.
  absl::Status EnableFp8(Fp8ScaleMode mode);
  void DisableFp8();
  // The FP8 GEMM's activation scratch for `rows` rows of up to `k` elements (nothing without
  // EnableFp8); the caller synchronizes first, as for SetScratch.
  absl::Status ReserveFp8(int64_t rows, int64_t k);
  Fp8Gemm* fp8() const { return fp8_.get(); }  // nullptr unless enabled

  // y (f32, row stride ldy) = x W^T.
  absl::Status Run(const GemmInput& x, int64_t M, const DeviceMatrix& w, float* y, int64_t ldy);

  // out[M, F] (contiguous; bf16 when out_bf16) = silu(x Wg^T) * (x Wu^T), w = [2F, K] holding
  // the gate rows then the up rows: fused in the GEMV, else through `scratch` (f32 [M, 2F]) and
  // the SiluMul kernel.
  absl::Status RunSiluMul(const GemmInput& x, int64_t M, const DeviceMatrix& w, float* scratch,
                          void* out, bool out_bf16);

  // Products run by the GEMV kernel and by cuBLAS since Init (tests).
  int64_t gemv_calls() const { return gemv_calls_; }  // bf16 and quantized GEMVs
  int64_t cublas_calls() const { return cublas_calls_; }
  int64_t fp8_calls() const;  // products run by the FP8 GEMM

 private:
  absl::Status GemmEx(const DeviceMatrix& w, const void* x, bool x_bf16, int64_t ldx,
                      int64_t columns, float* y, int64_t ldy, float beta);
  absl::Status RunGemv(const GemmInput& x, int64_t M, const DeviceMatrix& w, void* y, int64_t ldy,
                       bool y_bf16, bool silu_mul);
  absl::Status RunQuantGemv(const GemmInput& x, int64_t M, const DeviceMatrix& w, void* y,
                            int64_t ldy, bool y_bf16, bool silu_mul);
  // More than kGemvMaxRows rows over quantized weights: dequantized tiles, then cuBLAS.
  absl::Status RunDequantized(const GemmInput& x, int64_t M, const DeviceMatrix& w, float* y,
                              int64_t ldy);
  bool UseGemv(int64_t M, const DeviceMatrix& w) const;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  uint16_t* split_ = nullptr;
  int64_t split_elems_ = 0;
  float* stacked_ = nullptr;
  int64_t stack_rows_ = 0;
  int64_t stacked_cols_ = 0;
  int64_t gemv_calls_ = 0;
  int64_t cublas_calls_ = 0;
  std::unique_ptr<Fp8Gemm> fp8_;
};

}  // namespace tandem::cuda
