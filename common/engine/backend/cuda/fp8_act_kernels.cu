// The FP8 GEMM's kernels around cuBLASLt (fp8_gemm.h; contracts in quant_kernels.h): dynamic
// per-token quantization of the activations to fp8 e4m3, and the row and column scaling of the
// product where cuBLASLt's outer-vector scales are not available.
//
// Quantization: one warp per row; the lanes stride over the row for its max |value| (exact in any
// order), a butterfly of maxima gives it to every lane, then each lane writes the codes of the
// elements it read.

#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kv_codes.cuh"
#include "common/engine/backend/cuda/quant_kernels.h"

namespace tandem::cuda {
// Named (not anonymous): unity builds put this file in one translation unit with the other
// kernel files.
namespace fp8_act {

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

template <class XT>
TANDEM_GLOBAL void QuantizeRowsKernel(const XT* x, int64_t ldx, int64_t M, int64_t k,
                                      uint8_t* codes, float* scales) {
  const int lane = threadIdx.x & 31;
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (m >= M) return;  // the whole warp
  const XT* row = x + m * ldx;
  float amax = 0.0f;
  for (int64_t c = lane; c < k; c += 32) {
    const float v = dev::Load(row + c);
    const float a = v < 0.0f ? -v : v;
    amax = a > amax ? a : amax;
  }
  for (int mask = 16; mask > 0; mask >>= 1) {
    const float o = dev::ShflXor(amax, mask);
    amax = o > amax ? o : amax;
  }
  const float q = amax / 448.0f;
  const float s = q > kFp8MinActivationScale ? q : kFp8MinActivationScale;
  uint8_t* out = codes + m * k;
  for (int64_t c = lane; c < k; c += 32) out[c] = dev::FloatToFp8E4M3(dev::Load(row + c) / s);
  if (lane == 0) scales[m] = s;
}

TANDEM_GLOBAL void ScaleRowsColumnsKernel(float* y, int64_t ldy, int64_t M, int64_t n,
                                          const float* row_scales, const float* col_scales) {
  const int64_t total = M * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t m = i / n, j = i % n;
    y[m * ldy + j] = (col_scales[j] * row_scales[m]) * y[m * ldy + j];
  }
}

}  // namespace fp8_act

cudaError_t QuantizeActivationsFp8(const void* x, bool x_bf16, int64_t ldx, int64_t M, int64_t k,
                                   uint8_t* codes, float* scales, cudaStream_t stream) {
  if (M <= 0 || k <= 0) return cudaSuccess;
  const unsigned blocks =
      static_cast<unsigned>((M + fp8_act::kRowsPerBlock - 1) / fp8_act::kRowsPerBlock);
  if (x_bf16) {
    TANDEM_LAUNCH(fp8_act::QuantizeRowsKernel<uint16_t>, blocks, fp8_act::kThreads, 0, stream,
                  static_cast<const uint16_t*>(x), ldx, M, k, codes, scales);
  } else {
    TANDEM_LAUNCH(fp8_act::QuantizeRowsKernel<float>, blocks, fp8_act::kThreads, 0, stream,
                  static_cast<const float*>(x), ldx, M, k, codes, scales);
  }
  return cudaGetLastError();
}

cudaError_t ScaleRowsColumns(float* y, int64_t ldy, int64_t M, int64_t n, const float* row_scales,
                             const float* col_scales, cudaStream_t stream) {
  if (M <= 0 || n <= 0) return cudaSuccess;
  const int64_t blocks = (M * n + fp8_act::kThreads - 1) / fp8_act::kThreads;
  TANDEM_LAUNCH(fp8_act::ScaleRowsColumnsKernel,
                static_cast<unsigned>(blocks < fp8_act::kMaxBlocks ? blocks : fp8_act::kMaxBlocks),
                fp8_act::kThreads, 0, stream, y, ldy, M, n, row_scales, col_scales);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
