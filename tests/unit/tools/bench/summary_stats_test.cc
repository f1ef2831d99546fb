#include "tools/bench/summary_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace tandem::bench {
namespace {

TEST(SummaryStatsTest, PercentileInterpolatesBetweenRanks) {
  // numpy.percentile([1, 2, 3, 4], p): 50 -> 2.5, 90 -> 3.7, 99 -> 3.97, 0 -> 1, 100 -> 4.
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(PercentileOfSorted(v, 50), 2.5);
  EXPECT_NEAR(PercentileOfSorted(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(PercentileOfSorted(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(PercentileOfSorted(v, 0), 1);
  EXPECT_DOUBLE_EQ(PercentileOfSorted(v, 100), 4);
  EXPECT_DOUBLE_EQ(PercentileOfSorted(v, 150), 4);  // clamped
}

TEST(SummaryStatsTest, EdgeCases) {
  EXPECT_EQ(PercentileOfSorted({}, 50), 0);
  EXPECT_EQ(PercentileOfSorted({7}, 99), 7);
  const Summary empty = Summarize({});
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(empty.mean, 0);
  EXPECT_EQ(empty.p99, 0);
}

TEST(SummaryStatsTest, SummarizeSortsAndAverages) {
  const Summary s = Summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_NEAR(s.p90, 4.6, 1e-12);
  EXPECT_NEAR(s.p99, 4.96, 1e-12);
}

TEST(SummaryStatsTest, PercentilesOfAUniformSampleMatchItsQuantiles) {
  std::vector<double> v(1001);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) / 1000.0;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(9));
  const Summary s = Summarize(v);
  EXPECT_NEAR(s.p50, 0.5, 1e-12);
  EXPECT_NEAR(s.p90, 0.9, 1e-12);
  EXPECT_NEAR(s.p99, 0.99, 1e-12);
  EXPECT_NEAR(s.mean, 0.5, 1e-12);
}

}  // namespace
}  // namespace tandem::bench
