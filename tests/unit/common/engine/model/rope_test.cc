#include "common/engine/model/rope.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tandem {
namespace {

ModelConfig Config(int64_t head_dim, double theta) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  return c;
}

// transformers' llama3 rule restated in terms of the ratio original_max / wavelength, with the
// base frequencies computed through exp/log rather than pow.
std::vector<double> Llama3Reference(int64_t dim, double theta, double factor, double low,
                                    double high, double original_max) {
  const double kPi = 3.14159265358979323846;
  std::vector<double> out;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double freq = std::exp(-(2.0 * i / dim) * std::log(theta));
    const double ratio = original_max * freq / (2 * kPi);  // = original_max / wavelength
    if (ratio > high) {
      out.push_back(freq);  // high frequency: kept
    } else if (ratio < low) {
      out.push_back(freq / factor);  // low frequency: interpolated by `factor`
    } else {
      const double smooth = (ratio - low) / (high - low);
      out.push_back(freq * ((1 - smooth) / factor + smooth));
    }
  }
  return out;
}

TEST(RopeTest, DefaultFrequencies) {
  const std::vector<double> f = RopeInverseFrequencies(Config(8, 10000.0));
  ASSERT_EQ(f.size(), 4u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_DOUBLE_EQ(f[1], 0.1);
  EXPECT_DOUBLE_EQ(f[2], 0.01);
  EXPECT_DOUBLE_EQ(f[3], 0.001);
}

TEST(RopeTest, LinearScalingDividesEveryFrequency) {
  ModelConfig c = Config(64, 10000.0);
  const std::vector<double> base = RopeInverseFrequencies(c);
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 4.0;
  const std::vector<double> scaled = RopeInverseFrequencies(c);
  ASSERT_EQ(scaled.size(), 32u);
  for (size_t i = 0; i < base.size(); ++i) EXPECT_DOUBLE_EQ(scaled[i], base[i] / 4.0) << i;
}

TEST(RopeTest, Llama3ScalingMatchesIndependentFormula) {
  struct Case {
    int64_t dim;
    double theta, factor, low, high;
    int64_t original;
  };
  // Llama 3.1 8B, Llama 3.2 1B, and an unusual one with a wide smoothing band.
  for (const Case& k :
       {Case{128, 500000.0, 8.0, 1.0, 4.0, 8192}, Case{64, 500000.0, 32.0, 1.0, 4.0, 8192},
        Case{32, 10000.0, 2.0, 0.5, 16.0, 512}}) {
    ModelConfig c = Config(k.dim, k.theta);
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = k.factor;
    c.rope_scaling.low_freq_factor = k.low;
    c.rope_scaling.high_freq_factor = k.high;
    c.rope_scaling.original_max_position_embeddings = k.original;
    const std::vector<double> got = RopeInverseFrequencies(c);
    const std::vector<double> want =
        Llama3Reference(k.dim, k.theta, k.factor, k.low, k.high, static_cast<double>(k.original));
    ASSERT_EQ(got.size(), want.size());
    int kept = 0, divided = 0, smoothed = 0;
    const std::vector<double> base = RopeInverseFrequencies(Config(k.dim, k.theta));
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-12 * want[i]) << "dim " << k.dim << " i " << i;
      if (got[i] == base[i]) {
        ++kept;
      } else if (std::abs(got[i] - base[i] / k.factor) <= 1e-15 * base[i]) {
        ++divided;
      } else {
        ++smoothed;
      }
    }
    // Every regime is exercised.
    EXPECT_GT(kept, 0);
    EXPECT_GT(divided, 0);
    EXPECT_GT(smoothed, 0);
  }
}

TEST(RopeTest, Llama31KnownEndpoints) {
  ModelConfig c = Config(128, 500000.0);
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0;
  const std::vector<double> f = RopeInverseFrequencies(c);
  EXPECT_DOUBLE_EQ(f[0], 1.0);  // wavelength 2*pi: far below 8192 / 4
  EXPECT_DOUBLE_EQ(f[63], std::pow(500000.0, -126.0 / 128.0) / 8.0);
}

TEST(RopeTest, CosSinTableLayout) {
  ModelConfig c = Config(16, 10000.0);
  const std::vector<double> inv = RopeInverseFrequencies(c);
  const std::vector<float> table = RopeCosSinTable(c, 100);
  ASSERT_EQ(table.size(), 100u * 8 * 2);
  for (int pos : {0, 1, 7, 99}) {
    for (int i = 0; i < 8; ++i) {
      const double angle = pos * inv[i];
      EXPECT_EQ(table[(pos * 8 + i) * 2], static_cast<float>(std::cos(angle))) << pos << " " << i;
      EXPECT_EQ(table[(pos * 8 + i) * 2 + 1], static_cast<float>(std::sin(angle)))
          << pos << " " << i;
    }
  }
  EXPECT_EQ(table[0], 1.0f);
  EXPECT_EQ(table[1], 0.0f);
  EXPECT_TRUE(RopeCosSinTable(c, 0).empty());
}

}  // namespace
}  // namespace tandem
