#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::bench {

// A distribution of token counts (prompt or output lengths) for the load generator.
//   fixed:N            always N (a bare "N" means the same)
//   uniform:MIN:MAX    integers in [MIN, MAX], each equally likely
//   lognormal:MEAN:SIGMA[:MAX]
//                      exp(normal(mu, SIGMA)) with mu chosen so that the mean is MEAN,
//                      rounded and clamped to [1, MAX] (MAX defaults to 16 * MEAN)
struct LengthDistribution {
  enum class Kind { kFixed, kUniform, kLognormal };
  Kind kind = Kind::kFixed;
  int64_t fixed = 128;
  int64_t min = 1;  // uniform: lower bound; lognormal: clamp
  int64_t max = 128;
  double mean = 128;  // lognormal
  double sigma = 0;   // lognormal

  // The largest value Sample can return.
  int64_t UpperBound() const;
  // The expected value (before clamping for the lognormal).
  double Mean() const;
  std::string ToString() const;
};

absl::StatusOr<LengthDistribution> ParseLengthDistribution(const std::string& spec);

int64_t SampleLength(const LengthDistribution& d, std::mt19937_64& rng);

}  // namespace tandem::bench
