#include "common/base/half.h"

#include <cmath>
#include <cstring>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(HalfTest, Bf16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f))));
      continue;
    }
    EXPECT_EQ(FloatToBf16(f), h) << h;
  }
}

TEST(HalfTest, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), FloatToBf16(1.0f));
  // Slightly above halfway rounds up.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))),
            1.0f + std::ldexp(1.0f, -7));
}

TEST(HalfTest, Fp16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToFp16(f), h) << h;
  }
}

TEST(HalfTest, Fp16KnownValues) {
  EXPECT_EQ(Fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToFp16(1e6f), 0x7c00);
}

}  // namespace
}  // namespace tandem
