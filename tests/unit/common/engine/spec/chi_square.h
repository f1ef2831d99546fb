#pragma once

// Chi-square homogeneity test for two samples over categorical outcomes, for the statistical
// tests of speculative sampling. Categories with a small expected count are merged.

#include <cmath>
#include <map>
#include <vector>

namespace tandem::testing {

// Regularized upper incomplete gamma Q(a, x) (series / continued fraction, Numerical Recipes).
inline double GammaQ(double a, double x) {
  if (x <= 0) return 1.0;
  const double gln = std::lgamma(a);
  if (x < a + 1) {
    double sum = 1.0 / a, del = sum, ap = a;
    for (int n = 0; n < 1000; ++n) {
      ap += 1;
      del *= x / ap;
      sum += del;
      if (std::fabs(del) < std::fabs(sum) * 1e-14) break;
    }
    return 1.0 - sum * std::exp(-x + a * std::log(x) - gln);
  }
  double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-14) break;
  }
  return std::exp(-x + a * std::log(x) - gln) * h;
}

// p-value that samples `a` and `b` (counts per outcome) come from the same distribution.
inline double HomogeneityPValue(const std::map<int, int>& a, const std::map<int, int>& b) {
  double na = 0, nb = 0;
  std::map<int, std::pair<double, double>> cells;
  for (const auto& [k, v] : a) {
    cells[k].first += v;
    na += v;
  }
  for (const auto& [k, v] : b) {
    cells[k].second += v;
    nb += v;
  }
  // Merge outcomes whose expected count in either sample is below 5.
  std::vector<std::pair<double, double>> merged;
  std::pair<double, double> rare{0, 0};
  const double n = na + nb;
  for (const auto& [k, c] : cells) {
    const double total = c.first + c.second;
    if (total * na / n < 5 || total * nb / n < 5) {
      rare.first += c.first;
      rare.second += c.second;
    } else {
      merged.push_back(c);
    }
  }
  if (rare.first + rare.second > 0) merged.push_back(rare);
  if (merged.size() < 2) return 1.0;
  double chi2 = 0;
  for (const auto& c : merged) {
    const double total = c.first + c.second;
    const double ea = total * na / n, eb = total * nb / n;
    chi2 += (c.first - ea) * (c.first - ea) / ea + (c.second - eb) * (c.second - eb) / eb;
  }
  const double df = static_cast<double>(merged.size()) - 1;
  return GammaQ(df / 2, chi2 / 2);
}

}  // namespace tandem::testing
