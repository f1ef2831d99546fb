// Row-wise and element-wise kernels, fused where a step would otherwise make extra passes over
// its activations: embedding + RMSNorm, residual add + RMSNorm, gather + add + RMSNorm (each
// writing f32 or bf16), bias + RoPE + KV write, SiLU-multiply, the bf16 split/combine of the
// parity mode's products, and the gather of sampled tokens into the next step's inputs.

#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/kv_codes.cuh"

namespace tandem::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kFlatThreads = 256;
constexpr int64_t kMaxFlatBlocks = 1 << 16;

int FlatBlocks(int64_t total) {
  const int64_t blocks = (total + kFlatThreads - 1) / kFlatThreads;
  return static_cast<int>(blocks < kMaxFlatBlocks ? blocks : kMaxFlatBlocks);
}

// 1 / sqrt(mean(v^2) + eps) of the row whose element d is value(d), over the block.
template <class Value>
TANDEM_DEVICE float InverseRms(Value value, int64_t D, float eps, float* scratch) {
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float v = value(d);
    ss += v * v;
  }
  ss = dev::BlockSum(ss, scratch);
  return 1.0f / dev::Sqrt(ss / static_cast<float>(D) + eps);
}

// out[d] = value(d) * inv * weight[d], stored as OT (bf16: rounded to nearest even). Each thread
// writes the elements whose values it read in InverseRms, so in-place rows need no barrier.
template <class OT, class Value>
TANDEM_DEVICE void NormalizeRow(Value value, const float* weight, int64_t D, float eps, OT* out,
                                float* scratch) {
  const float inv = InverseRms(value, D, eps, scratch);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    dev::Store(out + d, value(d) * inv * weight[d]);
}

template <class OT>
TANDEM_GLOBAL void RmsNormKernel(const float* x, const float* weight, int64_t D, float eps,
                                 OT* out) {
  TANDEM_SHARED float scratch[32];
  const int64_t m = blockIdx.x;
  const float* row = x + m * D;
  NormalizeRow([row](int64_t d) { return row[d]; }, weight, D, eps, out + m * D, scratch);
}

template <class OT>
TANDEM_GLOBAL void AddRmsNormKernel(float* residual, const float* delta, const float* weight,
                                    int64_t D, float eps, OT* out) {
  TANDEM_SHARED float scratch[32];
  const int64_t m = blockIdx.x;
  float* r = residual + m * D;
  const float* dl = delta + m * D;
  // Each thread re-reads only the elements it wrote, so no barrier is needed before the norm.
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) r[d] += dl[d];
  NormalizeRow([r](int64_t d) { return r[d]; }, weight, D, eps, out + m * D, scratch);
}

// x[m] = table[ids[m]] (f32) and out[m] = RmsNorm(x[m]): the first layer's input norm fused
// into the embedding.
template <class T, class OT>
TANDEM_GLOBAL void EmbedRmsNormKernel(const int32_t* ids, const T* table, int64_t D,
                                      const float* weight, float eps, float* x, OT* out) {
  TANDEM_SHARED float scratch[32];
  const int64_t m = blockIdx.x;
  const T* src = table + static_cast<int64_t>(ids[m]) * D;
  float* row = x + m * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) row[d] = dev::Load(src + d);
  NormalizeRow([row](int64_t d) { return row[d]; }, weight, D, eps, out + m * D, scratch);
}

// out[i] = RmsNorm(x[rows[i]] + delta[rows[i]]) without writing the sum back (rows may repeat).
template <class OT>
TANDEM_GLOBAL void GatherAddRmsNormKernel(const float* x, const float* delta, int64_t ld,
                                          const int32_t* rows, int64_t D, const float* weight,
                                          float eps, OT* out) {
  TANDEM_SHARED float scratch[32];
  const int64_t i = blockIdx.x;
  const float* a = x + static_cast<int64_t>(rows[i]) * ld;
  const float* b = delta + static_cast<int64_t>(rows[i]) * ld;
  NormalizeRow([a, b](int64_t d) { return a[d] + b[d]; }, weight, D, eps, out + i * D, scratch);
}

template <class OT>
TANDEM_GLOBAL void SiluMulKernel(const float* gate_up, int64_t ld, int64_t M, int64_t F, OT* out) {
  const int64_t total = M * F;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / F, f = i % F;
    const float g = gate_up[m * ld + f];
    dev::Store(out + i, g / (1.0f + dev::Exp(-g)) * gate_up[m * ld + F + f]);
  }
}

TANDEM_GLOBAL void GatherSampledTokensKernel(const SampleOutput* samples, const int32_t* pairs,
                                             int64_t n, int32_t* tokens) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    tokens[pairs[2 * i]] = samples[pairs[2 * i + 1]].token;
  }
}

// Token m (one block): q += bias, rotated in place; k += bias, rotated, and v += bias written
// to the token's KV slot (skipped when the slot is negative). The CPU's order: product, bias,
// rotation, store. k and v pass through shared memory ([2][kv heads][head_dim] f32), since a
// quantized row's scale needs the whole row; then one warp stores each row.
template <DType T>
TANDEM_GLOBAL void RopeWriteKvKernel(float* qkv, int64_t ld, int32_t num_heads, KvLayerView kv,
                                     const int32_t* positions, const float* cos_sin,
                                     const float* bias, const int64_t* slots) {
  TANDEM_DYNAMIC_SHARED(float, kvs);
  const int64_t m = blockIdx.x;
  const int64_t hd = kv.head_dim, half = hd / 2, kvh = kv.num_kv_heads;
  const int64_t qd = num_heads * hd, kvd = kvh * hd;
  const float* cs = cos_sin + static_cast<int64_t>(positions[m]) * hd;
  float* row = qkv + m * ld;
  const int64_t slot = slots[m];
  const int64_t q_pairs = num_heads * half;
  const int64_t kv_items = slot < 0 ? 0 : kvh * half + kvd;  // k pairs, then v elements
  for (int64_t idx = threadIdx.x; idx < q_pairs + kv_items; idx += blockDim.x) {
    if (idx < q_pairs) {
      const int64_t h = idx / half, i = idx % half;
      float* p = row + h * hd;
      float a = p[i], b = p[i + half];
      if (bias != nullptr) {
        a += bias[h * hd + i];
        b += bias[h * hd + i + half];
      }
      const float c = cs[2 * i], s = cs[2 * i + 1];
      p[i] = a * c - b * s;
      p[i + half] = b * c + a * s;
      continue;
    }
    const int64_t e = idx - q_pairs;
    if (e < kvh * half) {
      const int64_t h = e / half, i = e % half;
      const int64_t col = qd + h * hd;
      float a = row[col + i], b = row[col + i + half];
      if (bias != nullptr) {
        a += bias[col + i];
        b += bias[col + i + half];
      }
      const float c = cs[2 * i], s = cs[2 * i + 1];
      kvs[h * hd + i] = a * c - b * s;
      kvs[h * hd + i + half] = b * c + a * s;
    } else {
      const int64_t v = e - kvh * half;
      const int64_t col = qd + kvd + v;
      kvs[kvd + v] = bias != nullptr ? row[col] + bias[col] : row[col];
    }
  }
  if (slot < 0) return;  // the whole block: the slot is the token's
  dev::SyncThreads();
  uint8_t* block = dev::KvBlockAt(kv, slot / kv.block_size, dev::KvBlockBytes(kv));
  const int64_t off = slot % kv.block_size;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int64_t r = threadIdx.x >> 5; r < 2 * kvh; r += warps) {
    dev::StoreKvRow<T>(block, kv, dev::KvRow(kv, static_cast<int>(r / kvh), r % kvh, off),
                       kvs + r * hd, lane);
  }
}

TANDEM_GLOBAL void SplitToBf16Kernel(const float* x, int64_t M, int64_t K, int64_t ldx,
                                     bool with_low, uint16_t* out) {
  const int64_t m = blockIdx.x;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const float f = x[m * ldx + k];
    const uint16_t hi = dev::FloatToBf16(f);
    out[m * K + k] = hi;
    if (with_low) out[(M + m) * K + k] = dev::FloatToBf16(f - dev::Bf16ToFloat(hi));
  }
}

TANDEM_GLOBAL void CombineSplitKernel(const float* y2, int64_t M, int64_t N, float* y,
                                      int64_t ldy) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[(i / N) * ldy + i % N] = y2[i] + y2[total + i];
  }
}

}  // namespace

cudaError_t RmsNorm(const float* x, const float* weight, int64_t M, int64_t D, float eps, void* out,
                    bool out_bf16, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  if (out_bf16) {
    TANDEM_LAUNCH(RmsNormKernel<uint16_t>, static_cast<unsigned>(M), kRowThreads, 0, stream, x,
                  weight, D, eps, static_cast<uint16_t*>(out));
  } else {
    TANDEM_LAUNCH(RmsNormKernel<float>, static_cast<unsigned>(M), kRowThreads, 0, stream, x, weight,
                  D, eps, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t AddRmsNorm(float* residual, const float* delta, const float* weight, int64_t M,
                       int64_t D, float eps, void* out, bool out_bf16, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  if (out_bf16) {
    TANDEM_LAUNCH(AddRmsNormKernel<uint16_t>, static_cast<unsigned>(M), kRowThreads, 0, stream,
                  residual, delta, weight, D, eps, static_cast<uint16_t*>(out));
  } else {
    TANDEM_LAUNCH(AddRmsNormKernel<float>, static_cast<unsigned>(M), kRowThreads, 0, stream,
                  residual, delta, weight, D, eps, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t EmbedRmsNorm(const int32_t* ids, int64_t M, const void* table, bool table_bf16,
                         int64_t D, const float* weight, float eps, float* x, void* out,
                         bool out_bf16, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(M);
  if (table_bf16 && out_bf16) {
    TANDEM_LAUNCH((EmbedRmsNormKernel<uint16_t, uint16_t>), grid, kRowThreads, 0, stream, ids,
                  static_cast<const uint16_t*>(table), D, weight, eps, x,
                  static_cast<uint16_t*>(out));
  } else if (table_bf16) {
    TANDEM_LAUNCH((EmbedRmsNormKernel<uint16_t, float>), grid, kRowThreads, 0, stream, ids,
                  static_cast<const uint16_t*>(table), D, weight, eps, x, static_cast<float*>(out));
  } else if (out_bf16) {
    TANDEM_LAUNCH((EmbedRmsNormKernel<float, uint16_t>), grid, kRowThreads, 0, stream, ids,
                  static_cast<const float*>(table), D, weight, eps, x, static_cast<uint16_t*>(out));
  } else {
    TANDEM_LAUNCH((EmbedRmsNormKernel<float, float>), grid, kRowThreads, 0, stream, ids,
                  static_cast<const float*>(table), D, weight, eps, x, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t GatherAddRmsNorm(const float* x, const float* delta, int64_t ld, const int32_t* rows,
                             int64_t n, int64_t D, const float* weight, float eps, void* out,
                             bool out_bf16, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (out_bf16) {
    TANDEM_LAUNCH(GatherAddRmsNormKernel<uint16_t>, static_cast<unsigned>(n), kRowThreads, 0,
                  stream, x, delta, ld, rows, D, weight, eps, static_cast<uint16_t*>(out));
  } else {
    TANDEM_LAUNCH(GatherAddRmsNormKernel<float>, static_cast<unsigned>(n), kRowThreads, 0, stream,
                  x, delta, ld, rows, D, weight, eps, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

namespace {

template <DType T>
cudaError_t LaunchRopeWriteKv(float* qkv, int64_t ld, int64_t M, int32_t heads,
                              const int32_t* positions, const float* cos_sin, const float* bias,
                              const int64_t* slots, const KvLayerView& kv, cudaStream_t stream) {
  const size_t smem = 2 * static_cast<size_t>(kv.num_kv_heads) * kv.head_dim * sizeof(float);
  TANDEM_LAUNCH(RopeWriteKvKernel<T>, static_cast<unsigned>(M), 128, smem, stream, qkv, ld, heads,
                kv, positions, cos_sin, bias, slots);
  return cudaGetLastError();
}

}  // namespace

cudaError_t RopeWriteKv(float* qkv, int64_t ld, int64_t M, int64_t num_heads,
                        const int32_t* positions, const float* cos_sin, const float* bias,
                        const int64_t* slots, const KvLayerView& kv, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  const int32_t h = static_cast<int32_t>(num_heads);
  switch (kv.dtype) {
    case DType::kF32:
      return LaunchRopeWriteKv<DType::kF32>(qkv, ld, M, h, positions, cos_sin, bias, slots, kv,
                                            stream);
    case DType::kBF16:
      return LaunchRopeWriteKv<DType::kBF16>(qkv, ld, M, h, positions, cos_sin, bias, slots, kv,
                                             stream);
    case DType::kI8:
      return LaunchRopeWriteKv<DType::kI8>(qkv, ld, M, h, positions, cos_sin, bias, slots, kv,
                                           stream);
    case DType::kF8E4M3:
      return LaunchRopeWriteKv<DType::kF8E4M3>(qkv, ld, M, h, positions, cos_sin, bias, slots, kv,
                                               stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t SiluMul(const float* gate_up, int64_t ld, int64_t M, int64_t F, void* out,
                    bool out_bf16, cudaStream_t stream) {
  if (M * F == 0) return cudaSuccess;
  if (out_bf16) {
    TANDEM_LAUNCH(SiluMulKernel<uint16_t>, FlatBlocks(M * F), kFlatThreads, 0, stream, gate_up, ld,
                  M, F, static_cast<uint16_t*>(out));
  } else {
    TANDEM_LAUNCH(SiluMulKernel<float>, FlatBlocks(M * F), kFlatThreads, 0, stream, gate_up, ld, M,
                  F, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t GatherSampledTokens(const SampleOutput* samples, const int32_t* pairs, int64_t n,
                                int32_t* tokens, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  TANDEM_LAUNCH(GatherSampledTokensKernel, FlatBlocks(n), kFlatThreads, 0, stream, samples, pairs,
                n, tokens);
  return cudaGetLastError();
}

cudaError_t SplitToBf16(const float* x, int64_t M, int64_t K, int64_t ldx, bool with_low,
                        uint16_t* out, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  TANDEM_LAUNCH(SplitToBf16Kernel, static_cast<unsigned>(M), kRowThreads, 0, stream, x, M, K, ldx,
                with_low, out);
  return cudaGetLastError();
}

cudaError_t CombineSplit(const float* y2, int64_t M, int64_t N, float* y, int64_t ldy,
                         cudaStream_t stream) {
  if (M * N == 0) return cudaSuccess;
  TANDEM_LAUNCH(CombineSplitKernel, FlatBlocks(M * N), kFlatThreads, 0, stream, y2, M, N, y, ldy);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
