// The sampler without a full sort: the single-pass draw (no truncation) and the partial
// selection for top-k / top-p / min-p against a reference that sorts the whole vocabulary.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/engine/sampler/sampler.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// The textbook pipeline: softmax, full sort (descending, ties by id), top-k, renormalise,
// top-p, min-p.
std::vector<int32_t> ReferenceKept(const SamplingParams& p, const std::vector<float>& logits) {
  const int32_t n = static_cast<int32_t>(logits.size());
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  std::vector<double> e(n);
  for (int32_t i = 0; i < n; ++i) {
    e[i] = std::exp((static_cast<double>(logits[i]) - logits[order[0]]) / p.temperature);
  }
  order.erase(std::remove_if(order.begin(), order.end(), [&](int32_t id) { return e[id] == 0; }),
              order.end());
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(p.top_k);
  double mass = 0;
  for (int32_t id : order) mass += e[id];
  size_t keep = order.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      cum += e[order[i]] / mass;
      if (cum >= p.top_p) {
        keep = std::min(keep, i + 1);
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    size_t cut = 1;
    while (cut < keep && e[order[cut]] >= p.min_p) ++cut;
    keep = cut;
  }
  order.resize(keep);
  return order;
}

std::vector<float> RandomLogits(int32_t n, std::mt19937& rng, bool with_masked, bool with_ties) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> l(n);
  for (float& x : l) x = normal(rng);
  if (with_ties) {
    for (float& x : l) x = std::round(x);
  }
  if (with_masked) {
    for (int32_t i = 0; i < n; ++i) {
      if (rng() % 3 == 0) l[i] = -std::numeric_limits<float>::infinity();
    }
  }
  return l;
}

TEST(SamplerSelectionTest, PartialSelectionKeepsWhatAFullSortKeeps) {
  std::mt19937 rng(3);
  int cases = 0;
  for (int32_t n : {5, 100, 5000, 40000}) {
    for (int trial = 0; trial < 6; ++trial) {
      const std::vector<float> l = RandomLogits(n, rng, trial % 2 == 1, trial % 3 == 2);
      for (int32_t top_k : {0, 1, 7, 300}) {
        for (float top_p : {1.0f, 0.3f, 0.9f, 0.999f}) {
          for (float min_p : {0.0f, 0.05f}) {
            SamplingParams p;
            p.temperature = trial % 2 ? 0.7f : 1.3f;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            TokenDistribution d = ComputeDistribution(p, l.data(), n);
            std::vector<int32_t> want = ReferenceKept(p, l);
            const bool cut = (top_k > 0 && top_k < n) || top_p < 1.0f || min_p > 0.0f;
            if (!cut) std::sort(want.begin(), want.end());  // no cut: id order
            ASSERT_EQ(d.ids, want) << "n " << n << " k " << top_k << " p " << top_p << " min_p "
                                   << min_p << " trial " << trial;
            double total = 0;
            for (float pr : d.probs) total += pr;
            EXPECT_NEAR(total, 1.0, 1e-4);
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 6 * 4 * 4 * 2);
}

TEST(SamplerSelectionTest, SinglePassDrawEqualsTheDistributionDraw) {
  // Without truncation SampleToken draws in one pass; ComputeDistribution orders that case the
  // same way (id order), so one seed gives one stream through either path (speculative
  // verification uses the latter).
  std::mt19937 rng(5);
  for (int32_t n : {3, 1000, 32000}) {
    const std::vector<float> l = RandomLogits(n, rng, /*with_masked=*/true, false);
    SamplingParams p;
    p.temperature = 1.0f;
    TokenDistribution d = ComputeDistribution(p, l.data(), n);
    Rng a(9), b(9);
    int differ = 0;
    for (int i = 0; i < 2000; ++i) {
      const int32_t x = SampleToken(p, l.data(), n, a);
      const int32_t y = SampleFromDistribution(d, b);
      EXPECT_TRUE(std::isfinite(l[x])) << "drew a masked token";
      // Equal except when the draw lands within float rounding of a boundary.
      differ += x != y;
    }
    EXPECT_LE(differ, 2) << n;
  }
}

TEST(SamplerSelectionTest, SinglePassDrawFollowsTheSoftmax) {
  // Chi-square over 200k draws of a 6-token softmax with two masked tokens.
  std::vector<float> l = {0.5f, -std::numeric_limits<float>::infinity(), 1.5f,
                          0.0f, -std::numeric_limits<float>::infinity(), -1.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  double z = 0;
  for (float x : l) z += std::exp(x);
  std::vector<int> counts(l.size());
  Rng r(17);
  const int kDraws = 200000;
  for (int i = 0; i < kDraws; ++i) ++counts[SampleToken(p, l.data(), 6, r)];
  EXPECT_EQ(counts[1] + counts[4], 0);
  double chi2 = 0;
  for (int id : {0, 2, 3, 5}) {
    const double expected = kDraws * std::exp(l[id]) / z;
    chi2 += (counts[id] - expected) * (counts[id] - expected) / expected;
  }
  EXPECT_LT(chi2, 16.27);  // 3 degrees of freedom, p = 0.001
  // Every token refused: the lowest id, no NaN.
  std::vector<float> none(4, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(SampleToken(p, none.data(), 4, r), 0);
}

}  // namespace
}  // namespace tandem
