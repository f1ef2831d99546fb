// The capacity policy's decisions on their own: service order, sequence slots, the token budget,
// admission after a preemption, the blocks a write needs (growth and copy-on-write), whether they
// fit, and the preemption victim.

#include "common/engine/scheduler/capacity_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

Sequence Seq(uint64_t arrival_order, int32_t priority = 0, int32_t index = 0) {
  Sequence s;
  s.arrival_order = arrival_order;
  s.priority = priority;
  s.index = index;
  return s;
}

TEST(CapacityPolicyTest, FcfsServesByArrivalThenSampleIndex) {
  const Sequence first = Seq(1, /*priority=*/9), second = Seq(2, /*priority=*/-9);
  EXPECT_TRUE(ServedBefore(SchedulingPolicy::kFcfs, first, second));
  EXPECT_FALSE(ServedBefore(SchedulingPolicy::kFcfs, second, first));
  const Sequence sample0 = Seq(3, 0, /*index=*/0), sample1 = Seq(3, 0, /*index=*/1);
  EXPECT_TRUE(ServedBefore(SchedulingPolicy::kFcfs, sample0, sample1));
  EXPECT_FALSE(ServedBefore(SchedulingPolicy::kFcfs, sample1, sample0));
  EXPECT_FALSE(ServedBefore(SchedulingPolicy::kFcfs, sample0, sample0));  // a strict order
}

TEST(CapacityPolicyTest, PriorityServesLowerValuesFirstThenByArrival) {
  const Sequence old_low = Seq(1, /*priority=*/5), new_high = Seq(2, /*priority=*/-1);
  EXPECT_TRUE(ServedBefore(SchedulingPolicy::kPriority, new_high, old_low));
  EXPECT_FALSE(ServedBefore(SchedulingPolicy::kPriority, old_low, new_high));
  const Sequence a = Seq(1, 3), b = Seq(2, 3);
  EXPECT_TRUE(ServedBefore(SchedulingPolicy::kPriority, a, b));
  EXPECT_FALSE(ServedBefore(SchedulingPolicy::kPriority, b, a));
}

TEST(CapacityPolicyTest, SequenceSlotsTokenBudgetAndAdmission) {
  EXPECT_TRUE(HasSequenceSlot(0, 1));
  EXPECT_FALSE(HasSequenceSlot(1, 1));
  EXPECT_TRUE(HasSequenceSlot(63, 64));
  EXPECT_FALSE(HasSequenceSlot(64, 64));
  EXPECT_TRUE(HasTokenBudget(1));
  EXPECT_FALSE(HasTokenBudget(0));
  EXPECT_FALSE(HasTokenBudget(-3));  // a preempted row's tokens are not given back
  EXPECT_TRUE(MayAdmitAfter(0));
  EXPECT_FALSE(MayAdmitAfter(1));
}

TEST(CapacityPolicyTest, BlocksFitTheAvailablePool) {
  EXPECT_TRUE(BlocksFit(0, 0));
  EXPECT_TRUE(BlocksFit(3, 3));
  EXPECT_FALSE(BlocksFit(4, 3));
}

TEST(CapacityPolicyTest, BlocksToWriteCountsGrowthAndSharedBlocksInTheRange) {
  BlockPool pool(16, /*enable_prefix_cache=*/false);
  KvCacheManager kv(&pool, 4);
  SequenceBlocks blocks;
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 0, 1), 1);
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 0, 9), 3);
  ASSERT_TRUE(kv.Grow(&blocks, 8));  // positions [0, 8): 2 blocks
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 7, 8), 0);
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 8, 9), 1);
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 6, 13), 2);

  SequenceBlocks sibling;  // a forked sample shares both blocks
  kv.Fork(blocks, &sibling);
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 7, 8), 1);   // copy of block 1
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 0, 8), 2);   // copies of blocks 0 and 1
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 7, 9), 2);   // copy of block 1, new block 2
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 8, 12), 1);  // past the shared blocks
  kv.Free(&sibling);
  EXPECT_EQ(BlocksToWrite(kv, pool, blocks, 0, 8), 0);
  kv.Free(&blocks);
}

TEST(CapacityPolicyTest, VictimIsTheSequenceServedLast) {
  Sequence a = Seq(1), b = Seq(2), c = Seq(3);
  EXPECT_EQ(PreemptionVictim({&a, &b, &c}), &c);
  EXPECT_EQ(PreemptionVictim({&a}), &a);
}

}  // namespace
}  // namespace tandem
