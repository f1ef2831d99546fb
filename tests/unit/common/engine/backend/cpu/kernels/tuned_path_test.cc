// The default configuration on the running CPU takes a tuned MatMul for every weight format: the
// MatMul input dtype `--matmul-input-dtype auto` resolves to (cpu::AutoMatMulInputDtype, what the
// engine builder asks), over each format in the layout the loader then gives it, runs on the
// active tier's own kernels (the path RunColumns takes, cpu::MatMulPathOf), never on a generic
// fallback: weights dequantized to f32 or bf16 and multiplied by FMA, the scalar int8 reference,
// or the scalar tier on a CPU with SIMD. Fails on a CPU whose tier lacks a tuned kernel for a
// format (e.g. before the AVX2 integer kernels: TANDEM_SIMD=avx2 took f32-dequant-fma).

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/base/cpu_features.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cpu/kernels/tiers.h"

namespace tandem::cpu {
namespace {

struct Format {
  const char* name;
  WeightQuant quant;
  int64_t group;
};

// The weight as the engine builder and the loader make it for `input` (WeightView's rule:
// quantized weights take `input`, dense bf16 ones bf16 for int8 inputs).
MatMulWeight Configured(const Format& f, DType input) {
  MatMulWeight w;
  w.quant = f.quant;
  w.dtype = DType::kBF16;
  w.group_size = f.group;
  if (f.quant != WeightQuant::kNone) {
    w.input_dtype = input;
    w.layout = input == DType::kI8 ? WeightLayout::kTiles16 : WeightLayout::kRows;
  } else {
    w.input_dtype = input == DType::kI8 ? DType::kBF16 : input;
    w.layout = w.input_dtype == DType::kBF16 && Bf16TilesPreferred() ? WeightLayout::kTiles16
                                                                     : WeightLayout::kRows;
  }
  return w;
}

TEST(TunedPathTest, DefaultConfigurationTakesTunedMatMuls) {
  if (internal::SupportedSimdLevels().back() == SimdLevel::kScalar) {
    GTEST_SKIP() << "this CPU (" << GetCpuFeatures().model << ") has no SIMD tier";
  }
  const Format formats[] = {{"int8", WeightQuant::kInt8, 0},
                            {"int4 g32", WeightQuant::kInt4, 32},
                            {"int4 g128", WeightQuant::kInt4, 128},
                            {"bf16", WeightQuant::kNone, 0}};
  for (const Format& f : formats) {
    const DType input = AutoMatMulInputDtype(f.quant, DType::kBF16);
    const MatMulPath path = MatMulPathOf(Configured(f, input));
    EXPECT_TRUE(MatMulPathTuned(path))
        << f.name << " weights with auto (" << DTypeName(input) << ") MatMul inputs take "
        << MatMulPathName(path) << ", a generic path, on the " << ActiveTierName()
        << " tier of this CPU (" << GetCpuFeatures().model << ")";
  }
}

// The path reported is the one MatMul runs: with int8 inputs where the tier has integer dot
// products, its kernel and the reference give the same bits, and a quantized weight with f32
// inputs is reported as the generic dequantizing path.
TEST(TunedPathTest, ReportedPathsFollowTheInputs) {
  MatMulWeight w;
  w.quant = WeightQuant::kInt8;
  w.input_dtype = DType::kF32;
  EXPECT_EQ(MatMulPathOf(w), MatMulPath::kF32Dequant);
  EXPECT_FALSE(MatMulPathTuned(MatMulPath::kF32Dequant));
  EXPECT_FALSE(MatMulPathTuned(MatMulPath::kI8Reference));
  w.input_dtype = DType::kI8;
  w.layout = WeightLayout::kTiles16;
  EXPECT_EQ(MatMulPathOf(w), internal::ActiveTier().matmul_i8 != nullptr
                                 ? MatMulPath::kI8Dot
                                 : MatMulPath::kI8Reference);
}

}  // namespace
}  // namespace tandem::cpu
