// Batch invariance (DESIGN §4 "Determinism"): a token's logits are bit-identical whichever other
// tokens share the step and however its prompt was chunked.

#include <random>

#include "absl/strings/str_cat.h"

#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::testing {
namespace {

struct Case {
  DType weights;
  WeightQuant quant;
  int64_t group;
  DType kv;
  DType input = DType::kF32;  // MatMul inputs (CpuBackendOptions::matmul_input_dtype)
  bool bf16_tiles = false;    // dense bf16 matrices in WeightLayout::kTiles16
};

class BatchInvarianceTest : public ::testing::TestWithParam<Case> {};

TEST_P(BatchInvarianceTest, LogitsIdenticalAloneAndAmongSevenOthers) {
  const Case& c = GetParam();
  auto model = Load("stories260k", c.weights, c.quant, c.group, c.input, c.bf16_tiles);
  ASSERT_NE(model, nullptr);
  CpuBackendOptions options;
  options.num_blocks = 512;
  options.kv_dtype = c.kv;
  options.matmul_input_dtype = c.input;
  ExpectBatchInvariant(model, options);
}

INSTANTIATE_TEST_SUITE_P(
    Weights, BatchInvarianceTest,
    ::testing::Values(Case{DType::kF32, WeightQuant::kNone, 0, DType::kF32},
                      Case{DType::kBF16, WeightQuant::kNone, 0, DType::kBF16},
                      Case{DType::kBF16, WeightQuant::kNone, 0, DType::kBF16, DType::kBF16},
                      Case{DType::kBF16, WeightQuant::kNone, 0, DType::kBF16, DType::kBF16, true},
                      Case{DType::kF32, WeightQuant::kInt8, 0, DType::kF32},
                      Case{DType::kF32, WeightQuant::kInt4, 32, DType::kF32},
                      Case{DType::kBF16, WeightQuant::kInt4, 128, DType::kBF16},
                      Case{DType::kF32, WeightQuant::kNone, 0, DType::kI8},
                      Case{DType::kBF16, WeightQuant::kNone, 0, DType::kF8E4M3},
                      Case{DType::kBF16, WeightQuant::kInt8, 0, DType::kF8E4M3},
                      Case{DType::kF32, WeightQuant::kInt4, 32, DType::kI8},
                      Case{DType::kBF16, WeightQuant::kInt8, 0, DType::kBF16, DType::kI8},
                      Case{DType::kBF16, WeightQuant::kInt4, 128, DType::kBF16, DType::kI8}),
    [](const auto& info) {
      return absl::StrCat(std::string(DTypeName(info.param.weights)), "_",
                          std::string(WeightQuantName(info.param.quant)),
                          info.param.group > 0 ? absl::StrCat("g", info.param.group) : "", "_kv_",
                          std::string(DTypeName(info.param.kv)),
                          info.param.input == DType::kBF16 ? "_bf16_inputs"
                          : info.param.input == DType::kI8 ? "_int8_inputs"
                                                           : "",
                          info.param.bf16_tiles ? "_tiles" : "");
    });

}  // namespace
}  // namespace tandem::testing
