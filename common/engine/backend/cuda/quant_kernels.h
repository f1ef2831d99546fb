#pragma once

// Host entry points of the kernels over weight-only quantized matrices (quant_gemv_kernels.cu) and
// of the FP8 GEMM's two kernels (fp8_act_kernels.cu: activation quantization, row and column
// scaling; fp8_gemm.h).
// The device layout of a quantized [N, K] matrix is the host's WeightLayout::kRows
// (common/base/quant.h) for the codes, with the scales next to them:
//   int8: codes int8 [N, K] (row stride K bytes); scales f32 [N]. w[n, k] = q[n, k] * scale[n].
//   fp8: codes e4m3 [N, K] (row stride K bytes); scales f32 [N]. w[n, k] = e4m3(q[n, k]) *
//     scale[n]; everything below that says int8 holds for fp8 with the code's value (exact in
//     f32 and bf16) in place of the integer code.
//   int4: codes [N, Int4RowBytes(K)] (32-element chunks of 16 bytes, byte j holding element j in
//     its low nibble and element j + 16 in its high nibble); scales f32 [N, G, 2] holding each
//     group's (scale, zero) pair side by side (one 8-byte load per chunk), G = Int4Groups(K,
//     group_size). w[n, k] = (q[n, k] - zero[n, g]) * scale[n, g], g = k / group_size: one f32
//     product of exact operands, the CPU kernels' value bit for bit.
// Arithmetic (the CPU backend's, common/engine/backend/cpu/kernels/README.md):
//   f32 activations: int4 weights are that f32 value; int8 rows sum x * q and multiply the
//     finished sum by the row's scale (the CPU multiplies each x by q * scale: the two differ by
//     f32 rounding only).
//   bf16 activations: int8 as above (the CPU's bf16-input rule, `(sum * s)`); int4 weights are the
//     f32 value rounded to nearest-even bf16 (the CPU's bf16-input rule).
// Sums are f32.

#include <cstdint>

#include "common/base/quant.h"
#include "common/cuda/cuda_api.h"

namespace tandem::cuda {

// y[m, j] = sum_k x[m, k] * w[j, k] for m < rows (1 .. kGemvMaxRows), j < n, each weight row read
// once for all rows (128-bit loads of the codes), f32 sums in an order that depends on K only.
// With silu_mul the matrix holds 2n rows (gate rows, then up rows) and y[m, j] = silu(gate_j .
// x_m) * (up_j . x_m).
struct QuantGemvArgs {
  const void* x = nullptr;  // [rows, k], row stride ldx: bf16 (x_bf16) or f32
  int64_t ldx = 0;
  bool x_bf16 = false;
  int32_t rows = 0;
  WeightQuant quant = WeightQuant::kInt8;
  const uint8_t* codes = nullptr;  // the layout above
  const float* scales = nullptr;
  int64_t group_size = 0;  // int4
  int64_t n = 0;
  int64_t k = 0;
  void* y = nullptr;  // [rows, n], row stride ldy: bf16 (y_bf16) or f32
  int64_t ldy = 0;
  bool y_bf16 = false;
  bool silu_mul = false;
};
// cudaErrorInvalidValue for rows outside 1 .. kGemvMaxRows or a weight format other than int8 /
// int4 / fp8.
cudaError_t QuantGemv(const QuantGemvArgs& args, cudaStream_t stream);
// Whether the call takes the 128-bit path (int8, fp8: k % 16 == 0, int4: k % 32 == 0; 16-byte
// aligned codes, x and x rows); otherwise one element per lane and step.
bool QuantGemvVectorized(const QuantGemvArgs& args);

// Rows [n0, n0 + nr) of a quantized [*, k] matrix as dense rows out[nr, k] (contiguous; bf16 when
// out_bf16, else f32), the weights of a dense product: int8 the codes q themselves, fp8 the codes'
// values (exact in either type; the product's columns are then multiplied by the row scales,
// ScaleColumns); int4
// the f32 value (q - zero) * scale, rounded to nearest-even bf16 when out_bf16.
cudaError_t DequantizeRows(WeightQuant quant, const uint8_t* codes, const float* scales,
                           int64_t group_size, int64_t k, int64_t n0, int64_t nr, void* out,
                           bool out_bf16, cudaStream_t stream);

// y[m, j] *= scales[j] for m < M, j < n (y row stride ldy).
cudaError_t ScaleColumns(float* y, int64_t ldy, int64_t M, int64_t n, const float* scales,
                         cudaStream_t stream);

// The smallest per-token activation scale (vLLM's dynamic per-token fp8 quantization has the same
// floor): a row of zeros or of tiny values still gets a finite, nonzero scale.
inline constexpr float kFp8MinActivationScale = 1.0f / (448.0f * 512.0f);

// Dynamic per-token fp8 e4m3 quantization of activations (the FP8 GEMM's operand): for each row
// m < M of x ([M, k], row stride ldx; bf16 when x_bf16, else f32), scales[m] = max(max_k |x[m,
// k]| / 448, kFp8MinActivationScale) and codes[m, k] = e4m3(x[m, k] / scales[m]) (one f32
// division, rounded to nearest even, saturating at 448: quant.h's Fp8E4M3Code), codes contiguous
// [M, k]. Every operation is one IEEE operation, so the result is a function of x alone.
cudaError_t QuantizeActivationsFp8(const void* x, bool x_bf16, int64_t ldx, int64_t M, int64_t k,
                                   uint8_t* codes, float* scales, cudaStream_t stream);

// y[m, j] = (col_scales[j] * row_scales[m]) * y[m, j] for m < M, j < n (y row stride ldy): the
// FP8 GEMM's scales where cuBLASLt does not apply them (fp8_gemm.h).
cudaError_t ScaleRowsColumns(float* y, int64_t ldy, int64_t M, int64_t n, const float* row_scales,
                             const float* col_scales, cudaStream_t stream);

}  // namespace tandem::cuda
