#pragma once

#include <cstdint>
#include <vector>

namespace tandem::bench {

// The p-th percentile (p in [0, 100]) of sorted values, interpolating linearly between the two
// nearest ranks (numpy's default "linear" method): rank = p / 100 * (n - 1). 0 when empty.
double PercentileOfSorted(const std::vector<double>& sorted, double p);

// Count, mean and percentiles of a sample; every field is 0 when the sample is empty.
struct Summary {
  int64_t count = 0;
  double mean = 0;
  double min = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

Summary Summarize(std::vector<double> values);

}  // namespace tandem::bench
