// The batch-shape policy's decisions on their own: row order (decodes before prefill chunks),
// decode rows with speculation slots cut to the token budget, and prefill chunks.

#include "common/engine/scheduler/batch_shape_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// A sequence with `num_tokens` tokens of which `num_computed` are computed.
Sequence Seq(int64_t num_tokens, int64_t num_computed) {
  Sequence s;
  s.tokens.assign(num_tokens, 1);
  s.prompt_len = num_tokens;
  s.num_computed = num_computed;
  return s;
}

TEST(BatchShapePolicyTest, DecodesComeFirstThenPrefillsEachInServiceOrder) {
  Sequence p1 = Seq(10, 0), d1 = Seq(5, 4), p2 = Seq(8, 4), d2 = Seq(9, 8), d3 = Seq(3, 3);
  const std::vector<Sequence*> order = RowOrder({&p1, &d1, &p2, &d2, &d3});
  EXPECT_EQ(order, (std::vector<Sequence*>{&d1, &d2, &d3, &p1, &p2}));
  EXPECT_TRUE(RowOrder({}).empty());
}

TEST(BatchShapePolicyTest, DecodeRowIsOneTokenWithoutAProposal) {
  DecodeRow row = ShapeDecode(1, 0, 100);
  EXPECT_EQ(row.num_new_tokens, 1);
  EXPECT_EQ(row.num_drafts, 0);
  row = ShapeDecode(0, 0, 100);  // nothing to compute
  EXPECT_EQ(row.num_new_tokens, 0);
}

TEST(BatchShapePolicyTest, SpeculationSlotsAreCutToTheBudget) {
  DecodeRow row = ShapeDecode(1, 4, 100);  // room for all: 1 + 4 verified positions
  EXPECT_EQ(row.num_new_tokens, 5);
  EXPECT_EQ(row.num_drafts, 4);
  row = ShapeDecode(1, 4, 5);
  EXPECT_EQ(row.num_new_tokens, 5);
  EXPECT_EQ(row.num_drafts, 4);
  row = ShapeDecode(1, 4, 3);  // the proposal's first 2 tokens fit
  EXPECT_EQ(row.num_new_tokens, 3);
  EXPECT_EQ(row.num_drafts, 2);
  row = ShapeDecode(1, 4, 1);  // only the decode itself
  EXPECT_EQ(row.num_new_tokens, 1);
  EXPECT_EQ(row.num_drafts, 0);
}

TEST(BatchShapePolicyTest, PrefillChunksAreCutToTheBudgetAndTheChunkCap) {
  EXPECT_EQ(ShapePrefillChunk(25, 10, 0), 10);
  EXPECT_EQ(ShapePrefillChunk(5, 10, 0), 5);
  EXPECT_EQ(ShapePrefillChunk(25, 10, 6), 6);
  EXPECT_EQ(ShapePrefillChunk(25, 4, 6), 4);
  EXPECT_EQ(ShapePrefillChunk(3, 10, 6), 3);
}

}  // namespace
}  // namespace tandem
