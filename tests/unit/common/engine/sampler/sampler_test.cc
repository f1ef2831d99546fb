#include "common/engine/sampler/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::vector<float> Logits(std::initializer_list<float> v) { return std::vector<float>(v); }

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  auto l = Logits({0.5f, 2.0f, 2.0f, -1.0f});
  EXPECT_EQ(GreedyToken(l.data(), 4), 1);
}

TEST(SamplerTest, DistributionMatchesSoftmaxWithTemperature) {
  auto l = Logits({1.0f, 2.0f, 0.0f, -1.0f});
  SamplingParams p;
  p.temperature = 0.7f;
  TokenDistribution d = ComputeDistribution(p, l.data(), 4);
  ASSERT_EQ(d.ids.size(), 4u);
  double z = 0;
  for (float x : l) z += std::exp(x / 0.7);
  for (int id = 0; id < 4; ++id) {
    EXPECT_NEAR(d.ProbOf(id), std::exp(l[id] / 0.7) / z, 1e-6) << id;
  }
  // Nothing cut: id order (no sort); with a cut, by probability.
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1, 2, 3}));
  p.top_k = 3;
  EXPECT_EQ(ComputeDistribution(p, l.data(), 4).ids, (std::vector<int32_t>{1, 0, 2}));
}

TEST(SamplerTest, TopKTopPMinPFilter) {
  auto l = Logits({3.0f, 2.0f, 1.0f, 0.0f, -1.0f});
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 3;
  TokenDistribution d = ComputeDistribution(p, l.data(), 5);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1, 2}));
  double z = std::exp(3.0) + std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(d.probs[2], std::exp(1.0) / z, 1e-6);

  // Softmax of the 5 logits: 0.636, 0.234, 0.086, 0.032, 0.012. top_p 0.8 keeps two tokens.
  p.top_k = 0;
  p.top_p = 0.8f;
  d = ComputeDistribution(p, l.data(), 5);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1}));
  p.top_p = 0.9f;  // 0.636 + 0.234 = 0.870 < 0.9: needs the third
  d = ComputeDistribution(p, l.data(), 5);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1, 2}));

  // min_p 0.3: keep p >= 0.3 * 0.636 = 0.19 -> tokens 0 and 1.
  p.top_p = 1.0f;
  p.min_p = 0.3f;
  d = ComputeDistribution(p, l.data(), 5);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(d.probs[0] + d.probs[1], 1.0, 1e-6);
}

TEST(SamplerTest, PenaltiesFollowHfAndOpenAiSemantics) {
  auto l = Logits({2.0f, -2.0f, 1.0f, 1.0f});
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  std::vector<int32_t> prompt = {0}, output = {1, 1, 2};
  ProcessLogits(p, {prompt, output}, {}, l.data(), 4);
  EXPECT_FLOAT_EQ(l[0], 1.0f);                      // prompt token, positive: divided
  EXPECT_FLOAT_EQ(l[1], -4.0f - 0.5f - 2 * 0.25f);  // negative: multiplied; then presence+freq
  EXPECT_FLOAT_EQ(l[2], 0.5f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[3], 1.0f);  // untouched
}

TEST(SamplerTest, MinTokensMasksStopIdsAndLogitBiasApplies) {
  auto l = Logits({0.0f, 5.0f, 1.0f});
  SamplingParams p;
  p.min_tokens = 2;
  p.logit_bias = {{2, 3.0f}};
  std::vector<int32_t> output = {0};
  std::vector<int32_t> stop = {1};
  ProcessLogits(p, {{}, output}, stop, l.data(), 3);
  EXPECT_TRUE(std::isinf(l[1]) && l[1] < 0);
  EXPECT_FLOAT_EQ(l[2], 4.0f);
  EXPECT_EQ(GreedyToken(l.data(), 3), 2);
}

TEST(SamplerTest, SeededSamplingIsReproducibleAndMatchesDistribution) {
  auto l = Logits({1.0f, 0.0f, 2.0f, -0.5f, 0.5f});
  SamplingParams p;
  p.temperature = 1.0f;
  TokenDistribution d = ComputeDistribution(p, l.data(), 5);
  Rng a(42), b(42), c(43);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 200; ++i) {
    sa.push_back(SampleFromDistribution(d, a));
    sb.push_back(SampleFromDistribution(d, b));
    sc.push_back(SampleFromDistribution(d, c));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);

  // Chi-square goodness of fit over 100k draws (4 degrees of freedom; 18.47 is p = 0.001).
  const int kDraws = 100000;
  std::map<int32_t, int> counts;
  Rng r(7);
  for (int i = 0; i < kDraws; ++i) ++counts[SampleFromDistribution(d, r)];
  double chi2 = 0;
  for (int id = 0; id < 5; ++id) {
    double expected = kDraws * d.ProbOf(id);
    chi2 += (counts[id] - expected) * (counts[id] - expected) / expected;
  }
  EXPECT_LT(chi2, 18.47);
}

TEST(SamplerTest, LogprobsAreLogSoftmax) {
  auto l = Logits({1.0f, 3.0f, 2.0f});
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
  ComputeLogprobs(l.data(), 3, 2, 2, &chosen, &top);
  double z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(chosen.logprob, 2.0 - z, 1e-6);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 2);
  EXPECT_NEAR(top[0].logprob, 3.0 - z, 1e-6);
}

TEST(SamplerTest, ValidationNamesTheField) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("top_p"), std::string::npos);
  p = {};
  p.top_k = -1;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("top_k"), std::string::npos);
  p = {};
  p.stop_token_ids = {10};
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("stop_token_ids"), std::string::npos);
  p = {};
  EXPECT_TRUE(ValidateSamplingParams(p, 10).ok());
}

}  // namespace
}  // namespace tandem
