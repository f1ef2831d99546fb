// Row-wise and element-wise kernels: embedding, RMSNorm (+ residual add), RoPE, SiLU-multiply,
// KV writes into paged blocks, row gathers and the bf16 split/combine around cuBLAS.

#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kFlatThreads = 256;
constexpr int64_t kMaxFlatBlocks = 1 << 16;

int FlatBlocks(int64_t total) {
  const int64_t blocks = (total + kFlatThreads - 1) / kFlatThreads;
  return static_cast<int>(blocks < kMaxFlatBlocks ? blocks : kMaxFlatBlocks);
}

template <class T>
TANDEM_GLOBAL void EmbedKernel(const int32_t* ids, const T* table, int64_t D, float* out) {
  const int64_t m = blockIdx.x;
  const T* row = table + static_cast<int64_t>(ids[m]) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[m * D + d] = dev::Load(row + d);
}

// Shared by RmsNorm and AddRmsNorm: `x` already holds the (summed) residual row.
TANDEM_DEVICE void NormalizeRow(const float* x, const float* weight, int64_t D, float eps,
                                float* out, float* scratch) {
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ss += x[d] * x[d];
  ss = dev::BlockSum(ss, scratch);
  const float inv = 1.0f / dev::Sqrt(ss / static_cast<float>(D) + eps);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[d] = x[d] * inv * weight[d];
}

TANDEM_GLOBAL void RmsNormKernel(const float* x, const float* weight, int64_t D, float eps,
                                 float* out) {
  TANDEM_SHARED float scratch[32];
  const int64_t m = blockIdx.x;
  NormalizeRow(x + m * D, weight, D, eps, out + m * D, scratch);
}

TANDEM_GLOBAL void AddRmsNormKernel(float* residual, const float* delta, const float* weight,
                                    int64_t D, float eps, float* out) {
  TANDEM_SHARED float scratch[32];
  const int64_t m = blockIdx.x;
  float* r = residual + m * D;
  const float* dl = delta + m * D;
  // Each thread re-reads only the elements it wrote, so no barrier is needed before the norm.
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) r[d] += dl[d];
  NormalizeRow(r, weight, D, eps, out + m * D, scratch);
}

TANDEM_GLOBAL void RopeKernel(float* x, int64_t ldx, int64_t num_heads, int64_t head_dim,
                              const int32_t* positions, const float* cos_sin) {
  const int64_t m = blockIdx.x;
  const int64_t half = head_dim / 2;
  const float* cs = cos_sin + static_cast<int64_t>(positions[m]) * head_dim;
  float* row = x + m * ldx;
  for (int64_t idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int64_t h = idx / half, i = idx % half;
    const float c = cs[2 * i], s = cs[2 * i + 1];
    float* p = row + h * head_dim;
    const float a = p[i], b = p[i + half];
    p[i] = a * c - b * s;
    p[i + half] = b * c + a * s;
  }
}

TANDEM_GLOBAL void SiluMulKernel(const float* gate_up, int64_t ld, int64_t M, int64_t F,
                                 float* out) {
  const int64_t total = M * F;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / F, f = i % F;
    const float g = gate_up[m * ld + f];
    out[i] = g / (1.0f + dev::Exp(-g)) * gate_up[m * ld + F + f];
  }
}

template <class T>
TANDEM_GLOBAL void WriteKvKernel(const float* k, int64_t ldk, const float* v, int64_t ldv,
                                 const int64_t* slots, KvLayerView kv) {
  const int64_t m = blockIdx.x;
  const int64_t slot = slots[m];
  if (slot < 0) return;  // uniform over the block; no barriers below
  const int64_t bs = kv.block_size, hd = kv.head_dim, kvh = kv.num_kv_heads;
  const int64_t block = slot / bs, off = slot % bs;
  T* base = static_cast<T*>(kv.base) + block * 2 * kvh * bs * hd;
  for (int64_t idx = threadIdx.x; idx < 2 * kvh * hd; idx += blockDim.x) {
    const int64_t which = idx / (kvh * hd), h = (idx / hd) % kvh, d = idx % hd;
    const float value = which == 0 ? k[m * ldk + h * hd + d] : v[m * ldv + h * hd + d];
    dev::Store(base + ((which * kvh + h) * bs + off) * hd + d, value);
  }
}

TANDEM_GLOBAL void GatherRowsKernel(const float* src, int64_t ld, const int32_t* rows, int64_t D,
                                    float* dst) {
  const int64_t i = blockIdx.x;
  const float* s = src + static_cast<int64_t>(rows[i]) * ld;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[i * D + d] = s[d];
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

TANDEM_GLOBAL void CombineSplitKernel(const float* y2, int64_t M, int64_t N, const float* bias,
                                      float* y, int64_t ldy) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, n = i % N;
    float value = y2[i] + y2[total + i];
    if (bias != nullptr) value += bias[n];
    y[m * ldy + n] = value;
  }
}

TANDEM_GLOBAL void AddBiasKernel(float* y, int64_t M, int64_t N, int64_t ldy, const float* bias) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[(i / N) * ldy + i % N] += bias[i % N];
  }
}

}  // namespace

cudaError_t Embed(const int32_t* ids, int64_t M, const void* table, bool is_bf16, int64_t D,
                  float* out, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  if (is_bf16) {
    TANDEM_LAUNCH(EmbedKernel<uint16_t>, static_cast<unsigned>(M), kRowThreads, 0, stream, ids,
                  static_cast<const uint16_t*>(table), D, out);
  } else {
    TANDEM_LAUNCH(EmbedKernel<float>, static_cast<unsigned>(M), kRowThreads, 0, stream, ids,
                  static_cast<const float*>(table), D, out);
  }
  return cudaGetLastError();
}

cudaError_t RmsNorm(const float* x, const float* weight, int64_t M, int64_t D, float eps,
                    float* out, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  TANDEM_LAUNCH(RmsNormKernel, static_cast<unsigned>(M), kRowThreads, 0, stream, x, weight, D, eps,
                out);
  return cudaGetLastError();
}

cudaError_t AddRmsNorm(float* residual, const float* delta, const float* weight, int64_t M,
                       int64_t D, float eps, float* out, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  TANDEM_LAUNCH(AddRmsNormKernel, static_cast<unsigned>(M), kRowThreads, 0, stream, residual, delta,
                weight, D, eps, out);
  return cudaGetLastError();
}

cudaError_t Rope(float* x, int64_t M, int64_t ldx, int64_t num_heads, int64_t head_dim,
                 const int32_t* positions, const float* cos_sin, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  TANDEM_LAUNCH(RopeKernel, static_cast<unsigned>(M), 128, 0, stream, x, ldx, num_heads, head_dim,
                positions, cos_sin);
  return cudaGetLastError();
}

cudaError_t SiluMul(const float* gate_up, int64_t ld, int64_t M, int64_t F, float* out,
                    cudaStream_t stream) {
  if (M * F == 0) return cudaSuccess;
  TANDEM_LAUNCH(SiluMulKernel, FlatBlocks(M * F), kFlatThreads, 0, stream, gate_up, ld, M, F, out);
  return cudaGetLastError();
}

cudaError_t WriteKv(const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t M,
                    const int64_t* slots, const KvLayerView& kv, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  if (kv.is_bf16) {
    TANDEM_LAUNCH(WriteKvKernel<uint16_t>, static_cast<unsigned>(M), 128, 0, stream, k, ldk, v, ldv,
                  slots, kv);
  } else {
    TANDEM_LAUNCH(WriteKvKernel<float>, static_cast<unsigned>(M), 128, 0, stream, k, ldk, v, ldv,
                  slots, kv);
  }
  return cudaGetLastError();
}

cudaError_t GatherRows(const float* src, int64_t ld, const int32_t* rows, int64_t n, int64_t D,
                       float* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  TANDEM_LAUNCH(GatherRowsKernel, static_cast<unsigned>(n), kRowThreads, 0, stream, src, ld, rows,
                D, dst);
  return cudaGetLastError();
}

cudaError_t SplitToBf16(const float* x, int64_t M, int64_t K, int64_t ldx, bool with_low,
                        uint16_t* out, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  TANDEM_LAUNCH(SplitToBf16Kernel, static_cast<unsigned>(M), kRowThreads, 0, stream, x, M, K, ldx,
                with_low, out);
  return cudaGetLastError();
}

cudaError_t CombineSplit(const float* y2, int64_t M, int64_t N, const float* bias, float* y,
                         int64_t ldy, cudaStream_t stream) {
  if (M * N == 0) return cudaSuccess;
  TANDEM_LAUNCH(CombineSplitKernel, FlatBlocks(M * N), kFlatThreads, 0, stream, y2, M, N, bias, y,
                ldy);
  return cudaGetLastError();
}

cudaError_t AddBias(float* y, int64_t M, int64_t N, int64_t ldy, const float* bias,
                    cudaStream_t stream) {
  if (M * N == 0 || bias == nullptr) return cudaSuccess;
  TANDEM_LAUNCH(AddBiasKernel, FlatBlocks(M * N), kFlatThreads, 0, stream, y, M, N, ldy, bias);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
