#include "tools/bench/kv_occupancy.h"

#include <gtest/gtest.h>

namespace tandem::bench {
namespace {

TEST(KvOccupancyTest, OneSequence) {
  // 37 computed tokens in blocks of 16: 3 blocks (48 slots). Static: prompt 30 + 100 = 130
  // -> 9 blocks (144). Max length 512.
  const KvSlots s = SlotsOfSequence(30, 37, 100, 16, 512);
  EXPECT_EQ(s.filled, 37);
  EXPECT_EQ(s.paged, 48);
  EXPECT_EQ(s.static_reservation, 144);
  EXPECT_EQ(s.max_len, 512);
  EXPECT_DOUBLE_EQ(WasteFraction(s.paged, s.filled), 11.0 / 48);
}

TEST(KvOccupancyTest, MaxLengthIsNeverBelowTheStaticReservation) {
  EXPECT_EQ(SlotsOfSequence(30, 30, 100, 16, 0).max_len, 144);
}

TEST(KvOccupancyTest, SummedOverDecodeSteps) {
  // Prompt 16, 4 output tokens: computed 16, 17, 18, 19 over the four decode steps.
  const KvSlots s = SlotsOverDecodeSteps(16, 4, 4, 16, 64);
  EXPECT_EQ(s.filled, 16 + 17 + 18 + 19);
  EXPECT_EQ(s.paged, 16 + 32 + 32 + 32);
  EXPECT_EQ(s.static_reservation, 4 * 32);
  EXPECT_EQ(s.max_len, 4 * 64);
}

TEST(KvOccupancyTest, PagedWasteIsBelowOneBlockPerSequence) {
  // A long sequence wastes on average half a block at every step.
  const KvSlots s = SlotsOverDecodeSteps(500, 1000, 1000, 16, 2048);
  EXPECT_LT(WasteFraction(s.paged, s.filled), 16.0 / 500);
  EXPECT_GT(WasteFraction(s.static_reservation, s.filled), 0.3);
}

TEST(KvOccupancyTest, WasteOfNothingIsZero) { EXPECT_EQ(WasteFraction(0, 0), 0); }

}  // namespace
}  // namespace tandem::bench
