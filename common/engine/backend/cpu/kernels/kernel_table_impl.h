#pragma once

// Builds an ISA's KernelTable from the kernel templates. Included only by the per-ISA files,
// after their simd_*.h.

#include "common/base/cpu_features.h"
#include "common/engine/backend/cpu/kernels/attention_impl.h"
#include "common/engine/backend/cpu/kernels/elementwise_impl.h"
#include "common/engine/backend/cpu/kernels/kernels_internal.h"
#include "common/engine/backend/cpu/kernels/matmul_impl.h"

namespace tandem::cpu::impl {

// A constant expression, so the table is static data: fetching it runs no ISA-specific code.
template <class S>
constexpr internal::KernelTable MakeKernelTable(SimdLevel level) {
  return internal::KernelTable{
      .level = level,
      .name = S::kName,
      .matmul = &MatMulRange<S>,
      .rms_norm = &RmsNorm<S>,
      .add_rms_norm = &AddRmsNorm<S>,
      .apply_rope = &ApplyRope<S>,
      .silu_mul = &SiluMul<S>,
      .embed = &Embed<S>,
      .write_kv = &WriteKv<S>,
      .read_kv_slot = &ReadKvSlot<S>,
      .attention = &Attention<S>,
      .exp = &ExpArray<S>,
  };
}

}  // namespace tandem::cpu::impl
