#pragma once

// LoRA terms of a batch mixing adapters and the base model (BGMV-style: each token's rows go
// through its own adapter's matrices, all tokens of a step in one launch per product). Host
// entry points; pointers are device pointers; each returns the launch status.
//
// For a projection y = W x of `tokens` rows, a token t whose group g = group_of_token[t] >= 0
// (the step's adapter g, groups[g]) and whose adapter targets this (layer, target) gets
//   u[t, 0:r] = A x[t]         (LoraShrink: A [r, K], f32 sums)
//   y[t, 0:N] += scale * B u[t] (LoraExpand: B [N, r], f32 sums, then one multiply and add)
// Rows of the base model (g = -1) and adapters without this target are not touched. Every sum
// runs in an order fixed by K (shrink) or r (expand), never by the batch, so a token's result
// does not depend on the rows beside it. The CPU's arithmetic (cpu/lora.h): f32 products of the
// activations as given (bf16 activations are f32 values) and the adapter's f32 or bf16 elements.

#include <cstdint>

#include "common/cuda/cuda_api.h"

namespace tandem::cuda {

// One adapter's matrices for one (layer, target), on the device. Absent: a == nullptr.
struct LoraDeviceEntry {
  const void* a = nullptr;  // [rank, in], row-major
  const void* b = nullptr;  // [out, rank], row-major
  int32_t bf16 = 0;         // elements are bf16 (else f32)
  int32_t rank = 0;
};

// One adapter taking part in a step: its table of entries [layers * kNumLoraTargets] (index
// layer * kNumLoraTargets + target) in device memory, and its scale.
struct LoraDeviceGroup {
  const LoraDeviceEntry* table = nullptr;
  float scale = 0;
  int32_t rank = 0;
};

struct LoraProductArgs {
  const int32_t* group_of_token = nullptr;  // [tokens]: index into groups, -1 for the base model
  const LoraDeviceGroup* groups = nullptr;
  int32_t entry = 0;  // layer * kNumLoraTargets + target
  int32_t max_rank = 0;
  int64_t tokens = 0;
  float* u = nullptr;  // [tokens, max_rank] f32: the shrink's output, the expand's input
  // Shrink: x [tokens, k], row stride ldx, f32 or bf16.
  const void* x = nullptr;
  bool x_bf16 = false;
  int64_t ldx = 0;
  int64_t k = 0;
  // Expand: y [tokens, n] f32, row stride ldy.
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t n = 0;
};

cudaError_t LoraShrink(const LoraProductArgs& a, cudaStream_t stream);
cudaError_t LoraExpand(const LoraProductArgs& a, cudaStream_t stream);

}  // namespace tandem::cuda
