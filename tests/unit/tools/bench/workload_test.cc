#include "tools/bench/workload.h"

#include <gtest/gtest.h>

#include <set>

namespace tandem::bench {
namespace {

WorkloadOptions Options() {
  WorkloadOptions o;
  o.prompt_len = *ParseLengthDistribution("uniform:4:40");
  o.output_len = *ParseLengthDistribution("uniform:1:64");
  o.vocab_size = 1000;
  o.seed = 11;
  return o;
}

TEST(WorkloadTest, SameSeedSameRequests) {
  Workload a(Options()), b(Options());
  for (int i = 0; i < 50; ++i) {
    const RequestSpec x = a.Next(), y = b.Next();
    EXPECT_EQ(x.index, i);
    EXPECT_EQ(x.prompt, y.prompt);
    EXPECT_EQ(x.max_tokens, y.max_tokens);
  }
  WorkloadOptions other = Options();
  other.seed = 12;
  Workload c(other);
  Workload d(Options());
  EXPECT_NE(c.Next().prompt, d.Next().prompt);
}

TEST(WorkloadTest, TokensAndLengthsStayInRange) {
  Workload w(Options());
  for (int i = 0; i < 500; ++i) {
    const RequestSpec s = w.Next();
    ASSERT_GE(s.prompt.size(), 4u);
    ASSERT_LE(s.prompt.size(), 40u);
    ASSERT_GE(s.max_tokens, 1);
    ASSERT_LE(s.max_tokens, 64);
    EXPECT_EQ(s.prefix_id, -1);
    EXPECT_EQ(s.cancel_after, -1);
    for (int32_t t : s.prompt) {
      ASSERT_GE(t, 3);
      ASSERT_LT(t, 1000);
    }
  }
}

TEST(WorkloadTest, SharedPrefixesThenUniqueSuffixes) {
  WorkloadOptions o = Options();
  o.num_prefixes = 3;
  o.prefix_len = 32;
  Workload w(o);
  ASSERT_EQ(w.prefixes().size(), 3u);
  std::set<int32_t> used;
  std::set<std::vector<int32_t>> prompts;
  for (int i = 0; i < 300; ++i) {
    const RequestSpec s = w.Next();
    ASSERT_GE(s.prefix_id, 0);
    ASSERT_LT(s.prefix_id, 3);
    used.insert(s.prefix_id);
    const auto& prefix = w.prefixes()[s.prefix_id];
    ASSERT_GE(s.prompt.size(), prefix.size() + 4);
    EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), s.prompt.begin()));
    prompts.insert(s.prompt);
  }
  EXPECT_EQ(used.size(), 3u);
  EXPECT_EQ(prompts.size(), 300u);  // suffixes keep prompts distinct
}

TEST(WorkloadTest, RequestsFitTheContext) {
  WorkloadOptions o = Options();
  o.prompt_len = *ParseLengthDistribution("fixed:100");
  o.output_len = *ParseLengthDistribution("fixed:100");
  o.num_prefixes = 1;
  o.prefix_len = 20;
  o.max_model_len = 128;
  Workload w(o);
  const RequestSpec s = w.Next();
  EXPECT_LE(static_cast<int64_t>(s.prompt.size()) + s.max_tokens, 128);
  EXPECT_EQ(s.prompt.size(), 120u);  // the prompt keeps its length, the output shrinks
  EXPECT_EQ(s.max_tokens, 8);
}

TEST(WorkloadTest, CancelsTheRequestedFraction) {
  WorkloadOptions o = Options();
  o.cancel_fraction = 0.25;
  Workload w(o);
  int cancelled = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const RequestSpec s = w.Next();
    if (s.cancel_after < 0) continue;
    ++cancelled;
    EXPECT_GE(s.cancel_after, 1);
    EXPECT_LE(s.cancel_after, std::max(1, s.max_tokens - 1));
  }
  EXPECT_NEAR(cancelled, n / 4, 120);  // sd ~27
}

TEST(PoissonArrivalsTest, GapsAreExponentialWithTheRate) {
  PoissonArrivals arrivals(4.0, 5);
  const int n = 100000;
  double sum = 0, sq = 0;
  int below_mean = 0;
  for (int i = 0; i < n; ++i) {
    const double g = arrivals.NextGapSeconds();
    ASSERT_GE(g, 0);
    sum += g;
    sq += g * g;
    below_mean += g < 0.25;
  }
  EXPECT_NEAR(sum / n, 0.25, 0.005);
  EXPECT_NEAR(std::sqrt(sq / n - (sum / n) * (sum / n)), 0.25, 0.005);  // sd = mean
  EXPECT_NEAR(static_cast<double>(below_mean) / n, 1 - std::exp(-1.0), 0.01);
}

}  // namespace
}  // namespace tandem::bench
