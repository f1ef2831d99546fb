#pragma once

// Helpers shared by the CPU kernel tests: random data, bf16 copies, and a fixture that runs each
// test once per instruction-set level this CPU supports.

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/base/cpu_features.h"
#include "common/base/half.h"
#include "common/engine/backend/cpu/kernels/tiers.h"

namespace tandem::cpu::testing {

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

inline std::vector<float> RoundTripBf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(FloatToBf16(v[i]));
  return out;
}

// Runs the test body with the kernels of one tier (every tier this build has kernels for);
// skipped, saying so, where this CPU lacks the tier. Restores the default afterwards.
class PerSimdLevelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (!CpuSupportsLevel(GetParam())) {
      GTEST_SKIP() << "this CPU (" << GetCpuFeatures().model << ") lacks the "
                   << SimdLevelName(GetParam()) << " tier: its kernels are not checked here";
    }
    ASSERT_TRUE(internal::SetSimdLevelForTesting(GetParam()));
  }
  void TearDown() override { internal::ResetSimdLevelForTesting(); }
};

inline std::string LevelName(const ::testing::TestParamInfo<SimdLevel>& info) {
  std::string name;
  for (char c : SimdLevelName(info.param)) name.push_back(c == '-' ? '_' : c);
  return name;
}

}  // namespace tandem::cpu::testing

#define TANDEM_INSTANTIATE_PER_SIMD_LEVEL(suite)                                            \
  INSTANTIATE_TEST_SUITE_P(Levels, suite,                                                   \
                           ::testing::ValuesIn(::tandem::cpu::internal::BuiltSimdLevels()), \
                           ::tandem::cpu::testing::LevelName)
