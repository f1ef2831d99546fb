#include "tools/bench/length_distribution.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace tandem::bench {
namespace {

TEST(LengthDistributionTest, ParsesEveryKind) {
  auto bare = ParseLengthDistribution("64");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->kind, LengthDistribution::Kind::kFixed);
  EXPECT_EQ(bare->fixed, 64);
  EXPECT_EQ(bare->ToString(), "fixed:64");

  auto uniform = ParseLengthDistribution("uniform:8:32");
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  EXPECT_EQ(uniform->min, 8);
  EXPECT_EQ(uniform->max, 32);
  EXPECT_EQ(uniform->UpperBound(), 32);
  EXPECT_DOUBLE_EQ(uniform->Mean(), 20);

  auto lognormal = ParseLengthDistribution("lognormal:100:0.5");
  ASSERT_TRUE(lognormal.ok()) << lognormal.status();
  EXPECT_EQ(lognormal->kind, LengthDistribution::Kind::kLognormal);
  EXPECT_EQ(lognormal->max, 1600);  // 16 x the mean by default
  auto capped = ParseLengthDistribution("lognormal:100:0.5:300");
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->UpperBound(), 300);
}

TEST(LengthDistributionTest, RejectsBadSpecs) {
  for (const char* spec : {"", "0", "-3", "fixed:", "fixed:x", "uniform:5", "uniform:9:3",
                           "uniform:0:3", "lognormal:0:1", "lognormal:10", "lognormal:10:-1",
                           "lognormal:10:1:0", "zipf:1:2", "fixed:1:2"}) {
    EXPECT_FALSE(ParseLengthDistribution(spec).ok()) << spec;
  }
}

TEST(LengthDistributionTest, FixedAlwaysGivesItsValue) {
  std::mt19937_64 rng(1);
  auto d = ParseLengthDistribution("fixed:17");
  for (int i = 0; i < 100; ++i) EXPECT_EQ(SampleLength(*d, rng), 17);
}

TEST(LengthDistributionTest, UniformCoversItsRangeEvenly) {
  std::mt19937_64 rng(2);
  auto d = ParseLengthDistribution("uniform:10:19");
  std::vector<int> counts(10, 0);
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const int64_t v = SampleLength(*d, rng);
    ASSERT_GE(v, 10);
    ASSERT_LE(v, 19);
    ++counts[v - 10];
  }
  // Each value has probability 0.1: 10000 expected, sd ~95.
  for (int c : counts) EXPECT_NEAR(c, n / 10, 500);
}

TEST(LengthDistributionTest, LognormalHasTheRequestedMeanAndSpread) {
  std::mt19937_64 rng(3);
  auto d = ParseLengthDistribution("lognormal:200:0.6");
  const int n = 200000;
  double sum = 0, log_sum = 0, log_sq = 0;
  for (int i = 0; i < n; ++i) {
    const double v = static_cast<double>(SampleLength(*d, rng));
    ASSERT_GE(v, 1);
    ASSERT_LE(v, 3200);
    sum += v;
    log_sum += std::log(v);
    log_sq += std::log(v) * std::log(v);
  }
  EXPECT_NEAR(sum / n, 200, 2);  // rounding and a clamp far in the tail barely move the mean
  const double mu = log_sum / n;
  EXPECT_NEAR(mu, std::log(200) - 0.18, 0.01);  // mu = ln(mean) - sigma^2 / 2
  EXPECT_NEAR(std::sqrt(log_sq / n - mu * mu), 0.6, 0.01);
}

TEST(LengthDistributionTest, LognormalIsClampedToItsMaximum) {
  std::mt19937_64 rng(4);
  auto d = ParseLengthDistribution("lognormal:50:2:60");
  int at_max = 0;
  for (int i = 0; i < 10000; ++i) {
    const int64_t v = SampleLength(*d, rng);
    ASSERT_GE(v, 1);
    ASSERT_LE(v, 60);
    at_max += v == 60;
  }
  EXPECT_GT(at_max, 1000);  // sigma 2 puts much of the mass above 60
}

TEST(LengthDistributionTest, LognormalWithZeroSigmaIsTheMean) {
  std::mt19937_64 rng(5);
  auto d = ParseLengthDistribution("lognormal:42:0");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(SampleLength(*d, rng), 42);
}

}  // namespace
}  // namespace tandem::bench
