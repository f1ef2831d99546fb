// The verifier's output distribution equals the target's, whatever the proposal distribution,
// and the statistical test used for that is sharp enough to catch an always-accepting verifier.

#include "common/engine/spec/verifier.h"

#include <map>

#include "gtest/gtest.h"
#include "tests/unit/common/engine/spec/chi_square.h"

namespace tandem {
namespace {

// Draws from the target through speculation: the proposal x ~ q, then VerifyPosition.
std::map<int, int> Speculate(const std::vector<float>& target_logits, const SamplingParams& params,
                             const TokenDistribution& q, int draws, uint64_t seed,
                             bool always_accept) {
  Rng draft_rng(seed), verify_rng(seed + 1);
  std::map<int, int> counts;
  for (int i = 0; i < draws; ++i) {
    const int32_t x = SampleFromDistribution(q, draft_rng);
    VerifyResult r =
        VerifyPosition(params, target_logits.data(), static_cast<int32_t>(target_logits.size()), x,
                       &q, verify_rng, always_accept);
    ++counts[r.token];
  }
  return counts;
}

std::map<int, int> Plain(const std::vector<float>& target_logits, const SamplingParams& params,
                         int draws, uint64_t seed) {
  Rng rng(seed);
  TokenDistribution p =
      ComputeDistribution(params, target_logits.data(), static_cast<int32_t>(target_logits.size()));
  std::map<int, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[SampleFromDistribution(p, rng)];
  return counts;
}

TEST(VerifierTest, GreedyAcceptsOnlyTheArgmax) {
  std::vector<float> logits = {0.1f, 3.0f, 2.0f};
  SamplingParams greedy;
  Rng rng(1);
  EXPECT_TRUE(VerifyPosition(greedy, logits.data(), 3, 1, nullptr, rng).accepted);
  VerifyResult r = VerifyPosition(greedy, logits.data(), 3, 2, nullptr, rng);
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.token, 1);
  r = VerifyPosition(greedy, logits.data(), 3, -1, nullptr, rng);  // bonus
  EXPECT_EQ(r.token, 1);
}

class VerifierDistributionTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(VerifierDistributionTest, SpeculativeSamplingKeepsTheTargetDistribution) {
  std::vector<float> target = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f, 1.5f, 0.3f};
  std::vector<float> draft = {0.0f, 1.5f, 0.5f, 0.5f, 1.0f, -0.5f, -1.0f, 2.0f};
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = GetParam();
  TokenDistribution q = ComputeDistribution(params, draft.data(), 8);
  const int kDraws = 40000;
  auto want = Plain(target, params, kDraws, 11);
  auto got = Speculate(target, params, q, kDraws, 12, false);
  double p = testing::HomogeneityPValue(want, got);
  EXPECT_GT(p, 0.01) << "speculative sampling differs from the target distribution";
  // The same test run against an always-accepting verifier must fail: it yields q, not p.
  auto broken = Speculate(target, params, q, kDraws, 12, true);
  EXPECT_LT(testing::HomogeneityPValue(want, broken), 0.01);
}

TEST_P(VerifierDistributionTest, DeterministicProposalsKeepTheTargetDistribution) {
  std::vector<float> target = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f, 1.5f, 0.3f};
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = GetParam();
  const int kDraws = 40000;
  auto want = Plain(target, params, kDraws, 21);
  // An n-gram proposer always proposes token 2 here (a point mass; q == nullptr).
  Rng rng(22);
  std::map<int, int> got;
  for (int i = 0; i < kDraws; ++i) {
    ++got[VerifyPosition(params, target.data(), 8, 2, nullptr, rng).token];
  }
  EXPECT_GT(testing::HomogeneityPValue(want, got), 0.01);
}

INSTANTIATE_TEST_SUITE_P(TopK, VerifierDistributionTest, ::testing::Values(0, 4));

}  // namespace
}  // namespace tandem
