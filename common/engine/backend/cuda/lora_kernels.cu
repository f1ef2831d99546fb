// LoRA shrink and expand over a batch mixing adapters (lora_kernels.h).
//
// Shrink: one warp per (token, rank index j): lane l sums x[t, c] * A[j, c] over c = l, l + 32,
// ..., then the butterfly over the warp; blocks of kShrinkWarps warps take consecutive j of one
// token (grid: tokens x ceil(max_rank / kShrinkWarps)). Expand: one thread per (token, output n):
// the sum over j < r of u[t, j] * B[n, j] in order, then y += scale * sum (grid: ceil(n /
// kExpandThreads) x tokens). Neither uses shared memory or block barriers; whole warps leave
// together (a warp's token, group and j are uniform).

#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/lora_kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kShrinkWarps = 4;
constexpr int kExpandThreads = 128;

TANDEM_DEVICE float LoadElem(const void* p, int32_t bf16, int64_t i) {
  return bf16 != 0 ? dev::Bf16ToFloat(static_cast<const uint16_t*>(p)[i])
                   : static_cast<const float*>(p)[i];
}

template <class XT>
TANDEM_GLOBAL void LoraShrinkKernel(LoraProductArgs a) {
  const int64_t t = blockIdx.x;
  const int32_t g = a.group_of_token[t];
  if (g < 0) return;  // the base model: the whole block
  const LoraDeviceEntry e = a.groups[g].table[a.entry];
  if (e.a == nullptr) return;  // this adapter does not target the projection
  const int lane = threadIdx.x & 31;
  const int j = static_cast<int>(blockIdx.y) * kShrinkWarps + (threadIdx.x >> 5);
  if (j >= e.rank) return;  // the whole warp
  const XT* x = static_cast<const XT*>(a.x) + t * a.ldx;
  const int64_t row = static_cast<int64_t>(j) * a.k;
  float acc = 0.0f;
  for (int64_t c = lane; c < a.k; c += 32) acc += dev::Load(x + c) * LoadElem(e.a, e.bf16, row + c);
  acc = dev::WarpSum(acc);
  if (lane == 0) a.u[t * a.max_rank + j] = acc;
}

TANDEM_GLOBAL void LoraExpandKernel(LoraProductArgs a) {
  const int64_t t = blockIdx.y;
  const int32_t g = a.group_of_token[t];
  if (g < 0) return;
  const LoraDeviceGroup group = a.groups[g];
  const LoraDeviceEntry e = group.table[a.entry];
  if (e.a == nullptr) return;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kExpandThreads + threadIdx.x;
  if (n >= a.n) return;
  const float* u = a.u + t * a.max_rank;
  const int64_t row = n * e.rank;
  float acc = 0.0f;
  for (int j = 0; j < e.rank; ++j) acc += u[j] * LoadElem(e.b, e.bf16, row + j);
  a.y[t * a.ldy + n] += group.scale * acc;
}

}  // namespace

cudaError_t LoraShrink(const LoraProductArgs& a, cudaStream_t stream) {
  if (a.tokens <= 0 || a.max_rank <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(a.tokens),
                  static_cast<unsigned>((a.max_rank + kShrinkWarps - 1) / kShrinkWarps));
  if (a.x_bf16) {
    TANDEM_LAUNCH(LoraShrinkKernel<uint16_t>, grid, kShrinkWarps * 32, 0, stream, a);
  } else {
    TANDEM_LAUNCH(LoraShrinkKernel<float>, grid, kShrinkWarps * 32, 0, stream, a);
  }
  return cudaGetLastError();
}

cudaError_t LoraExpand(const LoraProductArgs& a, cudaStream_t stream) {
  if (a.tokens <= 0 || a.max_rank <= 0 || a.n <= 0) return cudaSuccess;
  if (a.tokens > 65535) return cudaErrorInvalidValue;  // gridDim.y's limit
  const dim3 grid(static_cast<unsigned>((a.n + kExpandThreads - 1) / kExpandThreads),
                  static_cast<unsigned>(a.tokens));
  TANDEM_LAUNCH(LoraExpandKernel, grid, kExpandThreads, 0, stream, a);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
