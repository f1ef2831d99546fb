#pragma once

// Instruction-set tiers of the CPU kernels (README, "Tiers"): what each tier runs, which one the
// public entry points use, and the switches tests use. Included by dispatch.cc, tier_check.cc
// and tests, never by the per-ISA files.

#include <string>
#include <vector>

#include "common/base/cpu_features.h"
#include "common/engine/backend/cpu/kernels/int8_inputs.h"
#include "common/engine/backend/cpu/kernels/kernels_internal.h"

namespace tandem::cpu::internal {

#if defined(__aarch64__)
// The aarch64 tiers' kernels (kernels_neon*.cc): the f32 table, the integer MatMuls of the neon
// (smull), neon-dotprod (sdot) and neon-i8mm (usdot) tiers, and the NEON input quantizer.
const KernelTable& NeonKernels();
void MatMulI8NeonBase(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                      const float* bias, float* y, int64_t ldy);
void MatMulI8NeonDot(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                     const float* bias, float* y, int64_t ldy);
void MatMulI8NeonI8mm(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                      const float* bias, float* y, int64_t ldy);
void QuantizeRowI8Neon(const float* x, int64_t K, bool int4, int64_t group_size, int8_t* codes,
                       float* scale, int32_t* sum, float* group_sums);
#endif

// The kernels of one tier (kernels README, "Tiers"): the f32 table (an ISA's instantiation of
// the templates; several tiers share one) and the tier's dot-product MatMuls.
struct TierKernels {
  SimdLevel level;
  const KernelTable* f32;
  MatMulI8Fn matmul_i8;         // int8 inputs; nullptr: MatMulI8Reference
  QuantizeRowI8Fn quantize_i8;  // the input quantizer's row function; nullptr: the reference
  bool bf16_dot;                // bf16 inputs on vdpbf16ps (kernels_avx512bf16*.cc)
};

// The tier the public entry points use: the best this CPU supports at or below ActiveSimdLevel()
// (TANDEM_SIMD) that passes SelfCheckTier, unless overridden for testing.
const TierKernels& ActiveTier();

// Checks a tier's integer MatMul and input quantizer against the references on small random
// int8 and int4 problems (a few microseconds), bit for bit; false with a description when they
// differ. Run once per process before a tier is first used by default.
bool SelfCheckTier(const TierKernels& t, std::string* error);

// Tiers this CPU can run that this build has kernels for (ignores TANDEM_SIMD), in tier order.
std::vector<SimdLevel> SupportedSimdLevels();
// Every tier this build has kernels for, in tier order.
std::vector<SimdLevel> BuiltSimdLevels();

// Routes every public entry point to `level`'s kernels. Returns false (and changes nothing) if
// the CPU lacks that tier or the build has no kernels for it. Not thread-safe against kernels
// running concurrently.
bool SetSimdLevelForTesting(SimdLevel level);
// Back to the default tier.
void ResetSimdLevelForTesting();

// The tier the public entry points currently use.
SimdLevel CurrentSimdLevel();

}  // namespace tandem::cpu::internal
