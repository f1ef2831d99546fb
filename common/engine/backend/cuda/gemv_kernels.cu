// GEMV / skinny GEMM for bf16 weights: y[m, j] = sum_k x[m, k] W[j, k] for up to kGemvMaxRows
// rows of activations, each weight row streamed from memory once for all of them.
//
// One warp per output j (two weight rows, gate j and up j, for the fused SiLU epilogue). Lane l
// reads the 8-element chunks l, l + 32, l + 64, ... of the row with 16-byte streaming loads,
// kGemvUnroll chunks in flight, and keeps one f32 sum per (row of x, weight row): products in
// chunk order, elements in order within a chunk, then the butterfly over the warp. That order
// depends on K alone, never on the number of rows: the result of a row does not depend on the
// batch around it. Rows of K not a multiple of 8 (or unaligned operands) take the same path with
// one element per lane and step.

#include "common/engine/backend/cuda/gemv_common.cuh"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda {
namespace {

using gemv::kGemvWarps;
using gemv::LoadX8;
using gemv::Silu;
using gemv::Unpack8;
constexpr int kGemvUnroll = 4;  // 16-byte loads in flight per lane and weight row

// kRows: weight rows per output (1, or 2 for gate/up with the SiLU epilogue). kVec: 16-byte
// chunks (K % 8 == 0, operands 16-byte aligned) or single elements.
template <class XT, class YT, int kRows, bool kVec>
TANDEM_GLOBAL void GemvKernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (j >= a.n) return;  // the whole warp: no shuffle below is left half-done
  const uint16_t* w[kRows];
  w[0] = a.w + j * a.k;
  if (kRows == 2) w[kRows - 1] = a.w + (a.n + j) * a.k;
  const XT* x = static_cast<const XT*>(a.x);
  const int rows = a.rows;
  float acc[kGemvMaxRows][kRows];
  for (int m = 0; m < kGemvMaxRows; ++m) {
    for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;
  }
  if (kVec) {
    constexpr int64_t kStep = 32 * 8;
    for (int64_t c0 = lane * 8; c0 < a.k; c0 += kStep * kGemvUnroll) {
      float wv[kGemvUnroll][kRows][8];
      TANDEM_UNROLL
      for (int u = 0; u < kGemvUnroll; ++u) {  // every load first, then the arithmetic
        const int64_t c = c0 + u * kStep;
        if (c >= a.k) break;
        TANDEM_UNROLL
        for (int r = 0; r < kRows; ++r) Unpack8(dev::Load16Stream(w[r] + c), wv[u][r]);
      }
      TANDEM_UNROLL
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int64_t c = c0 + u * kStep;
        if (c >= a.k) break;
        TANDEM_UNROLL
        for (int m = 0; m < kGemvMaxRows; ++m) {
          if (m >= rows) break;
          float xv[8];
          LoadX8(x + m * a.ldx + c, xv);
          TANDEM_UNROLL
          for (int i = 0; i < 8; ++i) {
            TANDEM_UNROLL
            for (int r = 0; r < kRows; ++r) acc[m][r] += xv[i] * wv[u][r][i];
          }
        }
      }
    }
  } else {
    for (int64_t c = lane; c < a.k; c += 32) {
      float wv[kRows];
      for (int r = 0; r < kRows; ++r) wv[r] = dev::Bf16ToFloat(w[r][c]);
      for (int m = 0; m < kGemvMaxRows; ++m) {
        if (m >= rows) break;
        const float xv = dev::Load(x + m * a.ldx + c);
        for (int r = 0; r < kRows; ++r) acc[m][r] += xv * wv[r];
      }
    }
  }
  YT* y = static_cast<YT*>(a.y);
  TANDEM_UNROLL
  for (int m = 0; m < kGemvMaxRows; ++m) {
    if (m >= rows) break;  // uniform over the warp
    float v[kRows];
    TANDEM_UNROLL
    for (int r = 0; r < kRows; ++r) v[r] = dev::WarpSum(acc[m][r]);
    if (lane != m % 32) continue;
    float out;
    if (kRows == 2) {
      out = Silu(v[0]) * v[kRows - 1];
    } else {
      out = a.bias != nullptr ? v[0] + a.bias[j] : v[0];
    }
    dev::Store(y + m * a.ldy + j, out);
  }
}

template <class XT, class YT, int kRows>
void LaunchGemv(const GemvArgs& a, bool vec, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((a.n + kGemvWarps - 1) / kGemvWarps);
  void (*kernel)(GemvArgs) =
      vec ? &GemvKernel<XT, YT, kRows, true> : &GemvKernel<XT, YT, kRows, false>;
  TANDEM_LAUNCH(kernel, blocks, kGemvWarps * 32, 0, stream, a);
}

template <class XT>
void LaunchGemvX(const GemvArgs& a, bool vec, cudaStream_t stream) {
  if (a.silu_mul) {
    if (a.y_bf16) {
      LaunchGemv<XT, uint16_t, 2>(a, vec, stream);
    } else {
      LaunchGemv<XT, float, 2>(a, vec, stream);
    }
  } else if (a.y_bf16) {
    LaunchGemv<XT, uint16_t, 1>(a, vec, stream);
  } else {
    LaunchGemv<XT, float, 1>(a, vec, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GemvVectorized(const GemvArgs& a) {
  const int64_t x_elem = a.x_bf16 ? 2 : 4;
  return a.k % 8 == 0 && Aligned16(a.w) && Aligned16(a.x) && (a.ldx * x_elem) % 16 == 0;
}

cudaError_t Gemv(const GemvArgs& a, cudaStream_t stream) {
  if (a.rows <= 0 || a.n == 0) return cudaSuccess;
  if (a.rows > kGemvMaxRows || (a.silu_mul && a.bias != nullptr)) return cudaErrorInvalidValue;
  const bool vec = GemvVectorized(a);
  if (a.x_bf16) {
    LaunchGemvX<uint16_t>(a, vec, stream);
  } else {
    LaunchGemvX<float>(a, vec, stream);
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda
