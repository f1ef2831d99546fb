// Zero-copy destinations in KvCacheManager (SequenceBlocks::remote): the table's entries from
// remote_from on are a decode worker's block ids tagged kKvRemoteBlock, which the pool never
// sees: not allocated, referenced, cached nor freed, whatever happens to the sequence.

#include <numeric>
#include <vector>

#include "common/engine/kv/block_pool.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int64_t kBlock = 4;

std::vector<int32_t> RemoteTokens(int n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), 100);
  return t;
}

class KvRemoteTest : public ::testing::Test {
 protected:
  KvRemoteTest() : pool_(16, /*enable_prefix_cache=*/true), kv_(&pool_, kBlock) {}

  // A 5-block prompt whose blocks from `from` on are the remote ids 7, 3, 9, ...
  SequenceBlocks Destination(int64_t from) {
    SequenceBlocks s;
    const int32_t ids[] = {7, 3, 9, 0, 5};
    for (int64_t i = from; i < 5; ++i) s.remote.push_back(kKvRemoteBlock + ids[i - from]);
    s.remote_from = from;
    return s;
  }

  BlockPool pool_;
  KvCacheManager kv_;
};

TEST_F(KvRemoteTest, GrowTakesTheDestinationsBlocksAndAllocatesOnlyBeforeIt) {
  SequenceBlocks s = Destination(2);
  EXPECT_EQ(kv_.BlocksNeeded(s, 20), 2);  // only blocks 0 and 1 come from the pool
  ASSERT_TRUE(kv_.Grow(&s, 20));
  ASSERT_EQ(s.table.size(), 5u);
  EXPECT_LT(s.table[0], 16);
  EXPECT_LT(s.table[1], 16);
  EXPECT_EQ(s.table[2], kKvRemoteBlock + 7);
  EXPECT_EQ(s.table[4], kKvRemoteBlock + 9);
  EXPECT_EQ(pool_.num_referenced(), 2);
  EXPECT_EQ(kv_.PagesHeld(s), 2);
  // Copy-on-write never looks at (or copies) a destination block.
  EXPECT_EQ(kv_.CopiesNeeded(s, 0, 20), 0);
  std::vector<std::pair<int32_t, int32_t>> copies;
  EXPECT_TRUE(kv_.MakeWritable(&s, 0, 20, &copies));
  EXPECT_TRUE(copies.empty());
}

TEST_F(KvRemoteTest, DestinationBlocksAreNeverCachedNorFreedAndSurviveFree) {
  const std::vector<int32_t> tokens = RemoteTokens(20);
  SequenceBlocks s = Destination(1);
  ASSERT_TRUE(kv_.Grow(&s, 20));
  kv_.RegisterFull(tokens, 20, &s);
  EXPECT_EQ(pool_.num_cached(), 1);  // block 0 only
  SequenceBlocks fork;
  kv_.Fork(s, &fork);
  EXPECT_EQ(pool_.num_referenced(), 1);
  EXPECT_EQ(pool_.refcount(s.table[0]), 2);
  kv_.Free(&fork);
  kv_.Truncate(&s, 9);  // drops remote entries 3 and 4: nothing to release
  EXPECT_EQ(s.table.size(), 3u);
  kv_.Free(&s);  // preemption or an abort
  EXPECT_EQ(pool_.num_referenced(), 0);
  EXPECT_EQ(pool_.num_available(), 16);
  // The destination stays with the sequence: recomputed after preemption, it takes the cached
  // block 0 (never a cached block where the destination's go) and the same remote blocks.
  ASSERT_EQ(s.remote.size(), 4u);
  SequenceBlocks again = Destination(1);
  // The whole prompt is cached up to block 3 by another (copying) sequence.
  SequenceBlocks other;
  ASSERT_TRUE(kv_.Grow(&other, 20));
  kv_.RegisterFull(tokens, 20, &other);
  kv_.Free(&other);
  EXPECT_EQ(kv_.AcquirePrefix(tokens, &again), kBlock);
  ASSERT_TRUE(kv_.Grow(&again, 20));
  EXPECT_EQ(again.table[1], kKvRemoteBlock + 7);
  EXPECT_EQ(pool_.num_referenced(), 1);
  kv_.Free(&again);
  EXPECT_EQ(pool_.num_referenced(), 0);
  EXPECT_EQ(pool_.num_available(), 16);
}

TEST_F(KvRemoteTest, AWholeDestinationNeedsNoPoolBlock) {
  SequenceBlocks s = Destination(0);
  EXPECT_EQ(kv_.AcquirePrefix(RemoteTokens(20), &s), 0);
  EXPECT_EQ(kv_.BlocksNeeded(s, 20), 0);
  ASSERT_TRUE(kv_.Grow(&s, 20));
  EXPECT_EQ(s.table[0], kKvRemoteBlock + 7);
  EXPECT_EQ(pool_.num_referenced(), 0);
  kv_.Free(&s);
  EXPECT_EQ(pool_.num_available(), 16);
}

}  // namespace
}  // namespace tandem
