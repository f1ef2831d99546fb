// The bundled stories260k model at every instruction-set tier this CPU runs: with int8 and int4
// weights and int8 MatMul inputs (integer dot products, exact on every tier), tiers that share
// an f32 table (avx2 and avx-vnni; avx512 and avx512-vnni; the three aarch64 tiers) give the same
// logits bit for bit and so the same greedy tokens; every tier keeps the reference's top-1 token
// where the scalar tier does. Skipped, saying so, where this CPU runs no two tiers of one table.

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/engine/backend/cpu/kernels/tiers.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::testing {
namespace {

// Teacher-forced logits of the reference sequence (prompt as one chunk, then one token a step).
std::vector<std::vector<float>> Logits(const std::shared_ptr<const Model>& model) {
  CpuBackendOptions options;
  options.num_blocks = 16;
  options.matmul_input_dtype = DType::kI8;
  auto backend = CpuBackend::Create(model, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return {};
  const Reference ref = LoadReference("stories260k");
  TestSeq seq;
  seq.tokens = ref.sequence;
  BlockCounter blocks(options.block_size);
  RunStep(**backend, blocks, {{&seq, static_cast<int64_t>(ref.prompt_len)}});
  while (seq.computed < static_cast<int64_t>(seq.tokens.size())) {
    RunStep(**backend, blocks, {{&seq, 1}});
  }
  return seq.logits;
}

TEST(CpuBackendTiersTest, TiersOfOneTableGiveTheSameLogits) {
  const std::vector<SimdLevel> tiers = cpu::internal::SupportedSimdLevels();
  std::map<const void*, std::vector<SimdLevel>> by_table;
  for (SimdLevel l : tiers) {
    ASSERT_TRUE(cpu::internal::SetSimdLevelForTesting(l));
    by_table[cpu::internal::ActiveTier().f32].push_back(l);
  }
  cpu::internal::ResetSimdLevelForTesting();
  bool compared = false;
  for (const auto& [quant, group] :
       {std::pair{WeightQuant::kInt8, int64_t{128}}, std::pair{WeightQuant::kInt4, int64_t{32}}}) {
    auto model = Load("stories260k", DType::kF32, quant, group, DType::kI8);
    ASSERT_NE(model, nullptr);
    for (const auto& [table, levels] : by_table) {
      if (levels.size() < 2) continue;
      ASSERT_TRUE(cpu::internal::SetSimdLevelForTesting(levels[0]));
      const auto want = Logits(model);
      ASSERT_FALSE(want.empty());
      for (size_t i = 1; i < levels.size(); ++i) {
        ASSERT_TRUE(cpu::internal::SetSimdLevelForTesting(levels[i]));
        const auto got = Logits(model);
        ASSERT_EQ(got.size(), want.size());
        for (size_t r = 0; r < want.size(); ++r) {
          ASSERT_EQ(0, std::memcmp(got[r].data(), want[r].data(), want[r].size() * sizeof(float)))
              << WeightQuantName(quant) << ": " << SimdLevelName(levels[i]) << " differs from "
              << SimdLevelName(levels[0]) << " at position " << r;
        }
        compared = true;
      }
    }
  }
  cpu::internal::ResetSimdLevelForTesting();
  if (!compared) {
    GTEST_SKIP() << "this CPU (" << GetCpuFeatures().model
                 << ") runs no two tiers that share an f32 table";
  }
}

// Every tier's integer kernels keep the int8 model's top-1 tokens where the scalar tier's do.
TEST(CpuBackendTiersTest, EveryTierKeepsTheScalarTopOneTokens) {
  auto model = Load("stories260k", DType::kF32, WeightQuant::kInt8, 128, DType::kI8);
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(cpu::internal::SetSimdLevelForTesting(SimdLevel::kScalar));
  const auto scalar = Logits(model);
  for (SimdLevel l : cpu::internal::SupportedSimdLevels()) {
    ASSERT_TRUE(cpu::internal::SetSimdLevelForTesting(l));
    const auto got = Logits(model);
    ASSERT_EQ(got.size(), scalar.size());
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(std::max_element(got[r].begin(), got[r].end()) - got[r].begin(),
                std::max_element(scalar[r].begin(), scalar[r].end()) - scalar[r].begin())
          << SimdLevelName(l) << " position " << r;
    }
  }
  cpu::internal::ResetSimdLevelForTesting();
}

}  // namespace
}  // namespace tandem::testing
