// GEMV / skinny GEMM over weight-only quantized matrices (int8 and fp8 e4m3 per row, int4
// group-wise; layout and arithmetic in quant_kernels.h), and the two helpers of the tiled path
// that larger products take (gemm.cc): dequantization of a block of rows into dense scratch, and
// the column scaling of int8 and fp8 products.
//
// GEMV: one warp per output j (two weight rows, gate j and up j, for the fused SiLU epilogue), as
// the bf16 GEMV (gemv_kernels.cu). Lane l reads the 16-byte code chunks l, l + 32, l + 64, ... of
// the row (16 int8 / fp8 elements or 32 int4 elements each) with streaming loads, kUnroll chunks in
// flight (each int4 chunk with its group's (scale, zero) pair: groups are >= 32 elements, so a
// chunk lies in one group), dequantizes each 8 elements once for all activation rows and keeps one
// f32 sum per (row of x, weight row): chunks in order, elements in order within a chunk, then the
// butterfly over the warp; int8 and fp8 sums are multiplied by the row's scale at the end. The
// order depends on K alone, so a row's result does not depend on the batch around it. K not a
// multiple of the chunk (or unaligned operands) takes the same path with one element per lane and
// step.

#include "common/engine/backend/cuda/gemv_common.cuh"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/kv_codes.cuh"
#include "common/engine/backend/cuda/quant_kernels.h"

namespace tandem::cuda {
// Named (not anonymous): unity builds put this file in one translation unit with the other
// kernel files, whose anonymous namespaces hold helpers of the same names.
namespace quant_gemv {

using gemv::kGemvWarps;
using gemv::LoadX8;

constexpr int kUnroll = 4;  // 16-byte code loads in flight per lane and weight row

// quant.h's Int4RowBytes / Int4Groups, callable on the device.
TANDEM_HOST_DEVICE int64_t RowBytes4(int64_t k) { return (k + 31) / 32 * 16; }
TANDEM_HOST_DEVICE int64_t Groups4(int64_t k, int64_t group_size) {
  return (k + group_size - 1) / group_size;
}

// kQ: WeightQuant::kInt8, kInt4 or kFp8 (int8 and fp8 share everything but the decoding).
template <WeightQuant kQ>
struct Format {
  static constexpr bool kInt4 = kQ == WeightQuant::kInt4;
  static constexpr int kChunk = kInt4 ? 32 : 16;  // elements per 16-byte load
};

// The value of an fp8 e4m3 code (exact: the KV cache's widening, times 2^8).
TANDEM_DEVICE float Fp8Value(uint32_t c) {
  return dev::Fp8E4M3ToFloatScaled(static_cast<uint8_t>(c)) * 256.0f;
}

// Elements 8p .. 8p + 7 of one 16-byte fp8 chunk, as the codes' values (exact in f32 and bf16).
TANDEM_DEVICE void Fp8Values8(const dev::U32x4& v, int p, float* out) {
  const uint32_t lo = p == 0 ? v.x : v.z, hi = p == 0 ? v.y : v.w;
  TANDEM_UNROLL
  for (int i = 0; i < 4; ++i) {
    out[i] = Fp8Value((lo >> (8 * i)) & 0xffu);
    out[4 + i] = Fp8Value((hi >> (8 * i)) & 0xffu);
  }
}

// Elements 8p .. 8p + 7 of one 16-byte int8 chunk, as the f32 codes.
TANDEM_DEVICE void Int8Codes8(const dev::U32x4& v, int p, float* out) {
  const uint32_t lo = p == 0 ? v.x : v.z, hi = p == 0 ? v.y : v.w;
  TANDEM_UNROLL
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<float>(static_cast<int8_t>(lo >> (8 * i)));
    out[4 + i] = static_cast<float>(static_cast<int8_t>(hi >> (8 * i)));
  }
}

// Elements 8p .. 8p + 7 of one 16-byte int4 chunk (p < 2: low nibbles of bytes 8p .., p >= 2:
// high nibbles of bytes 8(p - 2) ..), dequantized: (q - zero) * scale, bf16-rounded when kRound.
template <bool kRound>
TANDEM_DEVICE void Int4Values8(const dev::U32x4& v, int p, float scale, float zero, float* out) {
  const int half = p & 1, shift = p >= 2 ? 4 : 0;
  const uint32_t lo = half == 0 ? v.x : v.z, hi = half == 0 ? v.y : v.w;
  TANDEM_UNROLL
  for (int i = 0; i < 4; ++i) {
    const float a = static_cast<float>((lo >> (8 * i + shift)) & 15u);
    const float b = static_cast<float>((hi >> (8 * i + shift)) & 15u);
    out[i] = (a - zero) * scale;
    out[4 + i] = (b - zero) * scale;
    if (kRound) {
      out[i] = gemv::RoundToBf16(out[i]);
      out[4 + i] = gemv::RoundToBf16(out[4 + i]);
    }
  }
}

// One element of a quantized row (the scalar path).
template <WeightQuant kQ, bool kRound>
TANDEM_DEVICE float ElementOf(const QuantGemvArgs& a, int64_t row, int64_t c) {
  if (kQ == WeightQuant::kFp8) return Fp8Value(a.codes[row * a.k + c]);
  if (kQ == WeightQuant::kInt8) {
    return static_cast<float>(static_cast<int8_t>(a.codes[row * a.k + c]));
  }
  const uint8_t b = a.codes[row * RowBytes4(a.k) + c / 32 * 16 + c % 16];
  const int q = c % 32 < 16 ? b & 15 : b >> 4;
  const float* sz = a.scales + (row * Groups4(a.k, a.group_size) + c / a.group_size) * 2;
  const float w = (static_cast<float>(q) - sz[1]) * sz[0];
  return kRound ? gemv::RoundToBf16(w) : w;
}

// kRows: weight rows per output (1, or 2 for gate/up with the SiLU epilogue). kVec: 16-byte
// chunks or single elements. int4 weights are rounded to bf16 with bf16 activations (XT).
template <class XT, class YT, int kRows, bool kVec, WeightQuant kQ>
TANDEM_GLOBAL void QuantGemvKernel(QuantGemvArgs a) {
  constexpr bool kInt4 = Format<kQ>::kInt4;
  constexpr bool kRound = kInt4 && sizeof(XT) == 2;
  constexpr int kChunk = Format<kQ>::kChunk;
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (j >= a.n) return;  // the whole warp: no shuffle below is left half-done
  int64_t wrow[kRows];
  wrow[0] = j;
  if (kRows == 2) wrow[kRows - 1] = a.n + j;
  const XT* x = static_cast<const XT*>(a.x);
  const int rows = a.rows;
  float acc[kGemvMaxRows][kRows];
  for (int m = 0; m < kGemvMaxRows; ++m) {
    for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;
  }
  if (kVec) {
    const int64_t row_bytes = kInt4 ? a.k / 2 : a.k;
    const int64_t groups = kInt4 ? Groups4(a.k, a.group_size) : 1;
    constexpr int64_t kStep = 32 * kChunk;
    for (int64_t c0 = lane * kChunk; c0 < a.k; c0 += kStep * kUnroll) {
      dev::U32x4 wq[kUnroll][kRows];
      float scale[kUnroll][kRows], zero[kUnroll][kRows];
      TANDEM_UNROLL
      for (int u = 0; u < kUnroll; ++u) {  // every load first, then the arithmetic
        const int64_t c = c0 + u * kStep;
        if (c >= a.k) break;
        TANDEM_UNROLL
        for (int r = 0; r < kRows; ++r) {
          wq[u][r] = dev::Load16Stream(a.codes + wrow[r] * row_bytes + (kInt4 ? c / 2 : c));
          if (kInt4) {
            const float* sz = a.scales + (wrow[r] * groups + c / a.group_size) * 2;
            scale[u][r] = sz[0];
            zero[u][r] = sz[1];
          }
        }
      }
      TANDEM_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kStep;
        if (c >= a.k) break;
        TANDEM_UNROLL
        for (int p = 0; p < kChunk / 8; ++p) {
          float wv[kRows][8];
          TANDEM_UNROLL
          for (int r = 0; r < kRows; ++r) {
            if constexpr (kInt4) {
              Int4Values8<kRound>(wq[u][r], p, scale[u][r], zero[u][r], wv[r]);
            } else if constexpr (kQ == WeightQuant::kFp8) {
              Fp8Values8(wq[u][r], p, wv[r]);
            } else {
              Int8Codes8(wq[u][r], p, wv[r]);
            }
          }
          TANDEM_UNROLL
          for (int m = 0; m < kGemvMaxRows; ++m) {
            if (m >= rows) break;
            float xv[8];
            LoadX8(x + m * a.ldx + c + 8 * p, xv);
            TANDEM_UNROLL
            for (int i = 0; i < 8; ++i) {
              TANDEM_UNROLL
              for (int r = 0; r < kRows; ++r) acc[m][r] += xv[i] * wv[r][i];
            }
          }
        }
      }
    }
  } else {
    for (int64_t c = lane; c < a.k; c += 32) {
      float wv[kRows];
      for (int r = 0; r < kRows; ++r) wv[r] = ElementOf<kQ, kRound>(a, wrow[r], c);
      for (int m = 0; m < kGemvMaxRows; ++m) {
        if (m >= rows) break;
        const float xv = dev::Load(x + m * a.ldx + c);
        for (int r = 0; r < kRows; ++r) acc[m][r] += xv * wv[r];
      }
    }
  }
  float row_scale[kRows];
  for (int r = 0; r < kRows; ++r) row_scale[r] = kInt4 ? 1.0f : a.scales[wrow[r]];
  YT* y = static_cast<YT*>(a.y);
  TANDEM_UNROLL
  for (int m = 0; m < kGemvMaxRows; ++m) {
    if (m >= rows) break;  // uniform over the warp
    float v[kRows];
    TANDEM_UNROLL
    for (int r = 0; r < kRows; ++r) {
      v[r] = dev::WarpSum(acc[m][r]);
      if (!kInt4) v[r] *= row_scale[r];
    }
    if (lane != m % 32) continue;
    const float out = kRows == 2 ? gemv::Silu(v[0]) * v[kRows - 1] : v[0];
    dev::Store(y + m * a.ldy + j, out);
  }
}

template <class XT, class YT, int kRows, WeightQuant kQ>
void Launch(const QuantGemvArgs& a, bool vec, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((a.n + kGemvWarps - 1) / kGemvWarps);
  void (*kernel)(QuantGemvArgs) =
      vec ? &QuantGemvKernel<XT, YT, kRows, true, kQ> : &QuantGemvKernel<XT, YT, kRows, false, kQ>;
  TANDEM_LAUNCH(kernel, blocks, kGemvWarps * 32, 0, stream, a);
}

template <class XT, WeightQuant kQ>
void LaunchX(const QuantGemvArgs& a, bool vec, cudaStream_t stream) {
  if (a.silu_mul) {
    if (a.y_bf16) {
      Launch<XT, uint16_t, 2, kQ>(a, vec, stream);
    } else {
      Launch<XT, float, 2, kQ>(a, vec, stream);
    }
  } else if (a.y_bf16) {
    Launch<XT, uint16_t, 1, kQ>(a, vec, stream);
  } else {
    Launch<XT, float, 1, kQ>(a, vec, stream);
  }
}

template <WeightQuant kQ>
void LaunchFormat(const QuantGemvArgs& a, bool vec, cudaStream_t stream) {
  if (a.x_bf16) {
    LaunchX<uint16_t, kQ>(a, vec, stream);
  } else {
    LaunchX<float, kQ>(a, vec, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

unsigned GridFor(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <class OT, WeightQuant kQ>
TANDEM_GLOBAL void DequantizeRowsKernel(const uint8_t* codes, const float* scales,
                                        int64_t group_size, int64_t k, int64_t n0, int64_t nr,
                                        OT* out) {
  const int64_t total = nr * k;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = n0 + i / k, c = i % k;
    float w;
    if (kQ == WeightQuant::kInt4) {
      const uint8_t b = codes[row * RowBytes4(k) + c / 32 * 16 + c % 16];
      const int q = c % 32 < 16 ? b & 15 : b >> 4;
      const float* sz = scales + (row * Groups4(k, group_size) + c / group_size) * 2;
      w = (static_cast<float>(q) - sz[1]) * sz[0];
    } else if (kQ == WeightQuant::kFp8) {
      w = Fp8Value(codes[row * k + c]);
    } else {
      w = static_cast<float>(static_cast<int8_t>(codes[row * k + c]));
    }
    dev::Store(out + i, w);  // bf16: round to nearest even
  }
}

TANDEM_GLOBAL void ScaleColumnsKernel(float* y, int64_t ldy, int64_t M, int64_t n,
                                      const float* scales) {
  const int64_t total = M * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t m = i / n, j = i % n;
    y[m * ldy + j] *= scales[j];
  }
}

}  // namespace quant_gemv

bool QuantGemvVectorized(const QuantGemvArgs& a) {
  const int64_t x_elem = a.x_bf16 ? 2 : 4;
  const int64_t chunk = a.quant == WeightQuant::kInt4 ? 32 : 16;
  return a.k % chunk == 0 && quant_gemv::Aligned16(a.codes) && quant_gemv::Aligned16(a.x) &&
         (a.ldx * x_elem) % 16 == 0;
}

cudaError_t QuantGemv(const QuantGemvArgs& a, cudaStream_t stream) {
  if (a.rows <= 0 || a.n == 0) return cudaSuccess;
  if (a.rows > kGemvMaxRows) return cudaErrorInvalidValue;
  const bool vec = QuantGemvVectorized(a);
  if (a.quant == WeightQuant::kInt8) {
    quant_gemv::LaunchFormat<WeightQuant::kInt8>(a, vec, stream);
  } else if (a.quant == WeightQuant::kFp8) {
    quant_gemv::LaunchFormat<WeightQuant::kFp8>(a, vec, stream);
  } else if (a.quant == WeightQuant::kInt4 && a.group_size >= 32 &&
             (a.group_size & (a.group_size - 1)) == 0) {
    quant_gemv::LaunchFormat<WeightQuant::kInt4>(a, vec, stream);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t DequantizeRows(WeightQuant quant, const uint8_t* codes, const float* scales,
                           int64_t group_size, int64_t k, int64_t n0, int64_t nr, void* out,
                           bool out_bf16, cudaStream_t stream) {
  if (nr <= 0 || k <= 0) return cudaSuccess;
  if (quant != WeightQuant::kInt8 && quant != WeightQuant::kInt4 && quant != WeightQuant::kFp8) {
    return cudaErrorInvalidValue;
  }
  const unsigned grid = quant_gemv::GridFor(nr * k);
  using quant_gemv::DequantizeRowsKernel;
  if (out_bf16) {
    void (*kernel)(const uint8_t*, const float*, int64_t, int64_t, int64_t, int64_t, uint16_t*) =
        quant == WeightQuant::kInt4  ? &DequantizeRowsKernel<uint16_t, WeightQuant::kInt4>
        : quant == WeightQuant::kFp8 ? &DequantizeRowsKernel<uint16_t, WeightQuant::kFp8>
                                     : &DequantizeRowsKernel<uint16_t, WeightQuant::kInt8>;
    TANDEM_LAUNCH(kernel, grid, quant_gemv::kThreads, 0, stream, codes, scales, group_size, k, n0,
                  nr, static_cast<uint16_t*>(out));
  } else {
    void (*kernel)(const uint8_t*, const float*, int64_t, int64_t, int64_t, int64_t, float*) =
        quant == WeightQuant::kInt4  ? &DequantizeRowsKernel<float, WeightQuant::kInt4>
        : quant == WeightQuant::kFp8 ? &DequantizeRowsKernel<float, WeightQuant::kFp8>
                                     : &DequantizeRowsKernel<float, WeightQuant::kInt8>;
    TANDEM_LAUNCH(kernel, grid, quant_gemv::kThreads, 0, stream, codes, scales, group_size, k, n0,
                  nr, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t ScaleColumns(float* y, int64_t ldy, int64_t M, int64_t n, const float* scales,
                         cudaStream_t stream) {
  if (M <= 0 || n <= 0) return cudaSuccess;
  TANDEM_LAUNCH(quant_gemv::ScaleColumnsKernel, quant_gemv::GridFor(M * n), quant_gemv::kThreads, 0,
                stream, y, ldy, M, n, scales);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
