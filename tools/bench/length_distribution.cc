#include "tools/bench/length_distribution.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::bench {
namespace {

absl::Status Bad(const std::string& spec, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad length distribution '", spec, "': ", why,
                   " (use N, fixed:N, uniform:MIN:MAX or lognormal:MEAN:SIGMA[:MAX])"));
}

}  // namespace

int64_t LengthDistribution::UpperBound() const { return kind == Kind::kFixed ? fixed : max; }

double LengthDistribution::Mean() const {
  switch (kind) {
    case Kind::kFixed:
      return static_cast<double>(fixed);
    case Kind::kUniform:
      return (static_cast<double>(min) + static_cast<double>(max)) / 2;
    case Kind::kLognormal:
      return mean;
  }
  return 0;
}

std::string LengthDistribution::ToString() const {
  switch (kind) {
    case Kind::kFixed:
      return absl::StrCat("fixed:", fixed);
    case Kind::kUniform:
      return absl::StrCat("uniform:", min, ":", max);
    case Kind::kLognormal:
      return absl::StrCat("lognormal:", mean, ":", sigma, ":", max);
  }
  return "";
}

absl::StatusOr<LengthDistribution> ParseLengthDistribution(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  LengthDistribution d;
  if (parts.size() == 1) parts.insert(parts.begin(), "fixed");
  const std::string kind = parts[0];
  if (kind == "fixed") {
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &d.fixed)) return Bad(spec, "not fixed:N");
    if (d.fixed < 1) return Bad(spec, "N must be >= 1");
    d.kind = LengthDistribution::Kind::kFixed;
    d.min = d.max = d.fixed;
    return d;
  }
  if (kind == "uniform") {
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &d.min) ||
        !absl::SimpleAtoi(parts[2], &d.max)) {
      return Bad(spec, "not uniform:MIN:MAX");
    }
    if (d.min < 1 || d.max < d.min) return Bad(spec, "need 1 <= MIN <= MAX");
    d.kind = LengthDistribution::Kind::kUniform;
    return d;
  }
  if (kind == "lognormal") {
    if (parts.size() < 3 || parts.size() > 4 || !absl::SimpleAtod(parts[1], &d.mean) ||
        !absl::SimpleAtod(parts[2], &d.sigma)) {
      return Bad(spec, "not lognormal:MEAN:SIGMA[:MAX]");
    }
    if (!(d.mean >= 1) || !(d.sigma >= 0) || d.sigma > 4) {
      return Bad(spec, "need MEAN >= 1 and 0 <= SIGMA <= 4");
    }
    d.max = static_cast<int64_t>(std::ceil(16 * d.mean));
    if (parts.size() == 4 && (!absl::SimpleAtoi(parts[3], &d.max) || d.max < 1)) {
      return Bad(spec, "MAX must be an integer >= 1");
    }
    d.kind = LengthDistribution::Kind::kLognormal;
    d.min = 1;
    return d;
  }
  return Bad(spec, absl::StrCat("unknown kind '", kind, "'"));
}

int64_t SampleLength(const LengthDistribution& d, std::mt19937_64& rng) {
  switch (d.kind) {
    case LengthDistribution::Kind::kFixed:
      return d.fixed;
    case LengthDistribution::Kind::kUniform:
      return std::uniform_int_distribution<int64_t>(d.min, d.max)(rng);
    case LengthDistribution::Kind::kLognormal: {
      // E[exp(N(mu, s^2))] = exp(mu + s^2 / 2).
      const double mu = std::log(d.mean) - d.sigma * d.sigma / 2;
      const double x =
          d.sigma == 0 ? d.mean : std::exp(std::normal_distribution<double>(mu, d.sigma)(rng));
      return std::clamp<int64_t>(std::llround(x), d.min, d.max);
    }
  }
  return 1;
}

}  // namespace tandem::bench
