// The window layout of KvCacheManager: local pages come with new blocks, are released once the
// window has passed their block, are shared and copied with their block, cached with it, and a
// prefix is reused only while its last window's local pages are cached.

#include <map>
#include <numeric>

#include "common/engine/kv/block_pool.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int64_t kBlock = 4;

std::vector<int32_t> Tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

int64_t LocalPages(const SequenceBlocks& s) {
  int64_t n = 0;
  for (const auto& g : s.local) {
    for (int32_t p : g) n += p >= 0;
  }
  return n;
}

class WindowTest : public ::testing::Test {
 protected:
  // A 6-token window, two local groups; the mapping the backend would see.
  WindowTest()
      : pool_(64, /*enable_prefix_cache=*/true),
        kv_(&pool_, kBlock, KvWindow{6, 2}, [this](int32_t block, int64_t group, int32_t page) {
          if (page < 0) {
            map_.erase({block, group});
          } else {
            map_[{block, group}] = page;
          }
        }) {}

  int32_t Mapped(int32_t block, int64_t group) {
    auto it = map_.find({block, group});
    return it == map_.end() ? -1 : it->second;
  }

  BlockPool pool_;
  KvCacheManager kv_;
  std::map<std::pair<int32_t, int64_t>, int32_t> map_;
};

TEST_F(WindowTest, DecodingHoldsOnlyTheWindowsPages) {
  SequenceBlocks s;
  ASSERT_EQ(kv_.BlocksNeeded(s, 5), 2 * 3);  // two blocks, each with two local pages
  ASSERT_TRUE(kv_.Grow(&s, 5));
  EXPECT_EQ(pool_.num_referenced(), 6);
  EXPECT_EQ(map_.size(), 4u);
  for (int64_t n = 6; n <= 60; ++n) {  // one token per step
    ASSERT_TRUE(kv_.Grow(&s, n));
    kv_.TrimWindow(&s, n);
    // A query at position n - 1 (or later) sees positions from n - 6 on: at most 3 blocks.
    EXPECT_LE(LocalPages(s), 2 * 3) << n;
    EXPECT_EQ(pool_.num_referenced(), kv_.PagesHeld(s));
    const int64_t first_needed = (n - 1 - 6 + 1) / kBlock;
    for (int64_t i = first_needed; i < static_cast<int64_t>(s.table.size()); ++i) {
      EXPECT_GE(s.local[0][i], 0) << n << " block " << i;
      EXPECT_EQ(Mapped(s.table[i], 1), s.local[0][i]);
    }
  }
  EXPECT_EQ(s.table.size(), 15u);
  EXPECT_LT(kv_.PagesHeld(s), 15 * 3 / 2) << "the window layout saves pages";
  kv_.Free(&s);
  EXPECT_EQ(pool_.num_referenced(), 0);
  EXPECT_TRUE(map_.empty());
}

TEST_F(WindowTest, ForkSharesAndCopyOnWriteCopiesLocalPages) {
  SequenceBlocks parent, child;
  ASSERT_TRUE(kv_.Grow(&parent, 6));
  kv_.Fork(parent, &child);
  EXPECT_EQ(pool_.num_referenced(), 6);
  std::vector<std::pair<int32_t, int32_t>> copies;
  EXPECT_EQ(kv_.CopiesNeeded(child, 6, 7), 3);
  ASSERT_TRUE(kv_.MakeWritable(&child, 6, 7, &copies));
  EXPECT_EQ(copies.size(), 3u);  // the block and its two local pages
  EXPECT_NE(child.local[0][1], parent.local[0][1]);
  EXPECT_EQ(child.local[0][0], parent.local[0][0]);
  EXPECT_EQ(Mapped(child.table[1], 2), child.local[1][1]);
  EXPECT_EQ(Mapped(parent.table[1], 2), parent.local[1][1]);
  kv_.Free(&parent);
  EXPECT_EQ(Mapped(child.table[0], 1), child.local[0][0]) << "the child still holds block 0";
  kv_.Free(&child);
  EXPECT_EQ(pool_.num_referenced(), 0);
  EXPECT_TRUE(map_.empty());
}

TEST_F(WindowTest, PrefixIsReusedOnlyWithItsWindowsLocalPages) {
  const std::vector<int32_t> prompt = Tokens(30);
  SequenceBlocks a;
  ASSERT_TRUE(kv_.Grow(&a, 30));
  kv_.RegisterFull(prompt, 30, &a);
  kv_.TrimWindow(&a, 30);
  // Blocks 0..5 lost their local pages; 6 and 7 (positions 24..31) keep them.
  EXPECT_EQ(a.local[0][5], -1);
  EXPECT_GE(a.local[0][6], 0);
  kv_.Free(&a);
  EXPECT_EQ(pool_.num_referenced(), 0);

  // The same prompt again: blocks 0..6 are cached; the cut at 28 needs the window before it
  // (blocks 5 and 6), whose local pages stayed cached (evictable) after their release.
  EXPECT_EQ(kv_.ProbePrefix(prompt, 0), 28);
  // Pressure evicts the least recently released pages first: the local pages of blocks 0..5
  // (released by the window), not the blocks. Then no cut has its window's pages.
  std::vector<int32_t> taken;
  for (int i = 0; i < 64 - 21 + 12; ++i) taken.push_back(*pool_.Allocate());
  for (int32_t b : taken) pool_.Release(b);
  EXPECT_EQ(pool_.num_cached(), 9);
  EXPECT_EQ(kv_.ProbePrefix(prompt, 0), 0);
  SequenceBlocks b;
  EXPECT_EQ(kv_.AcquirePrefix(prompt, &b), 0);
  EXPECT_TRUE(b.table.empty());
  EXPECT_EQ(pool_.num_referenced(), 0);

  // A longer prompt: its cut at 32 needs blocks 6 (cached above with its pages) and 7, computed
  // here (blocks 0..6 are duplicates of cached ones, so only block 7's pages get cached).
  std::vector<int32_t> longer = Tokens(40);
  SequenceBlocks c;
  ASSERT_TRUE(kv_.Grow(&c, 33));
  kv_.RegisterFull(longer, 32, &c);  // registers block 7 (positions 28..31) with its pages
  kv_.TrimWindow(&c, 32);
  kv_.Free(&c);
  EXPECT_EQ(kv_.ProbePrefix(longer, 0), 32);
  SequenceBlocks d;
  EXPECT_EQ(kv_.AcquirePrefix(longer, &d), 32);
  EXPECT_EQ(d.table.size(), 8u);
  EXPECT_EQ(d.local[0][5], -1);
  EXPECT_GE(d.local[0][6], 0);
  EXPECT_GE(d.local[1][7], 0);
  EXPECT_EQ(Mapped(d.table[7], 2), d.local[1][7]);
  EXPECT_EQ(pool_.num_referenced(), kv_.PagesHeld(d));
  kv_.Free(&d);
  EXPECT_EQ(pool_.num_referenced(), 0);
}

TEST_F(WindowTest, LocalPagesAreEvictableAndNeverNotified) {
  int stored = 0;
  pool_.set_listener({[&](BlockHash) { ++stored; }, [&](BlockHash) { --stored; }});
  const std::vector<int32_t> prompt = Tokens(9);
  SequenceBlocks a;
  ASSERT_TRUE(kv_.Grow(&a, 9));
  kv_.RegisterFull(prompt, 8, &a);
  EXPECT_EQ(stored, 2) << "only the two blocks are announced";
  EXPECT_EQ(pool_.num_cached(), 6);
  kv_.Free(&a);
  EXPECT_EQ(pool_.num_evictable(), 6);
  EXPECT_EQ(pool_.num_available(), 64);
  pool_.ClearCache();
  EXPECT_EQ(stored, 0);
}

TEST_F(WindowTest, TruncateDropsTheRolledBackBlocksPages) {
  SequenceBlocks s;
  ASSERT_TRUE(kv_.Grow(&s, 12));
  kv_.Truncate(&s, 5);
  EXPECT_EQ(s.table.size(), 2u);
  EXPECT_EQ(s.local[1].size(), 2u);
  EXPECT_EQ(pool_.num_referenced(), 6);
  kv_.Free(&s);
  EXPECT_TRUE(map_.empty());
}

// A remote prefill's reservation (decode role): the prompt's blocks, but local pages only for
// the blocks TrimWindow keeps once the prompt is computed, so trimming then releases nothing.
TEST_F(WindowTest, RemoteReservationHoldsOnlyTheWindowsLocalPages) {
  const std::vector<int32_t> prompt = Tokens(30);
  // A query at position 30 sees 25..30; with TrimWindow's margin blocks 6 and 7 (24..31).
  const int64_t from = kv_.WindowFirstBlock(30);
  EXPECT_EQ(from, 6);
  EXPECT_EQ(kv_.WindowFirstBlock(3), 0);
  SequenceBlocks s;
  EXPECT_EQ(kv_.BlocksNeeded(s, 30, from), 8 + 2 * 2);
  ASSERT_TRUE(kv_.Grow(&s, 30, from));
  EXPECT_EQ(pool_.num_referenced(), 12);
  EXPECT_EQ(kv_.PagesHeld(s), 12);
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(s.local[0][i] >= 0, i >= from) << i;
    EXPECT_EQ(Mapped(s.table[i], 2), s.local[1][i]) << i;  // -1: unmapped, reads as zeros
  }
  EXPECT_EQ(map_.size(), 4u);
  // The KV arrived: registering and trimming at the prompt's end changes nothing held.
  kv_.RegisterFull(prompt, 30, &s);
  kv_.TrimWindow(&s, 30);
  EXPECT_EQ(pool_.num_referenced(), 12);
  // Decoding on from here is as for a locally computed prompt.
  for (int64_t n = 31; n <= 45; ++n) {
    ASSERT_TRUE(kv_.Grow(&s, n));
    kv_.TrimWindow(&s, n);
    EXPECT_EQ(pool_.num_referenced(), kv_.PagesHeld(s));
    EXPECT_LE(LocalPages(s), 2 * 3) << n;
  }
  // The same numbers as a locally computed and trimmed sequence of that length.
  SequenceBlocks local;
  ASSERT_TRUE(kv_.Grow(&local, 45));
  kv_.TrimWindow(&local, 45);
  EXPECT_EQ(kv_.PagesHeld(s), kv_.PagesHeld(local));
  kv_.Free(&local);
  kv_.Free(&s);
  EXPECT_EQ(pool_.num_referenced(), 0);
  EXPECT_TRUE(map_.empty());
}

// With a cached prefix the reservation grows from it: the prefix brings its own window's local
// pages (released at the prompt's end), the new blocks get local pages only inside the window.
TEST_F(WindowTest, RemoteReservationAfterACachedPrefix) {
  SequenceBlocks a;
  ASSERT_TRUE(kv_.Grow(&a, 30));
  kv_.RegisterFull(Tokens(30), 30, &a);
  kv_.TrimWindow(&a, 30);
  kv_.Free(&a);

  const std::vector<int32_t> prompt = Tokens(60);
  SequenceBlocks s;
  ASSERT_EQ(kv_.AcquirePrefix(prompt, &s), 28);  // blocks 0..6, local pages of 5 and 6
  const int64_t from = kv_.WindowFirstBlock(60);
  EXPECT_EQ(from, 13);
  EXPECT_EQ(kv_.BlocksNeeded(s, 60, from), (15 - 7) + 2 * 2);
  ASSERT_TRUE(kv_.Grow(&s, 60, from));
  EXPECT_EQ(kv_.PagesHeld(s), 15 + 2 * (2 + 2));
  EXPECT_EQ(pool_.num_referenced(), kv_.PagesHeld(s));
  for (int64_t i = 7; i < 15; ++i) EXPECT_EQ(s.local[1][i] >= 0, i >= from) << i;
  kv_.RegisterFull(prompt, 60, &s);
  kv_.TrimWindow(&s, 60);  // the prefix's window pages go
  EXPECT_EQ(kv_.PagesHeld(s), 15 + 2 * 2);
  EXPECT_EQ(pool_.num_referenced(), kv_.PagesHeld(s));
  kv_.Free(&s);
  EXPECT_EQ(pool_.num_referenced(), 0);
  EXPECT_TRUE(map_.empty());
}

TEST(KvCacheManagerTest, WithoutAWindowNothingChanges) {
  BlockPool pool(8, false);
  KvCacheManager kv(&pool, kBlock);
  SequenceBlocks s;
  EXPECT_EQ(kv.BlocksNeeded(s, 9), 3);
  ASSERT_TRUE(kv.Grow(&s, 9));
  kv.TrimWindow(&s, 9);
  EXPECT_EQ(pool.num_referenced(), 3);
  EXPECT_EQ(kv.PagesFor(100, 16), 25);
  EXPECT_EQ(kv.WindowFirstBlock(100), 0);
  EXPECT_EQ(kv.BlocksNeeded(s, 20, /*local_from=*/2), 2);
  kv.Free(&s);
}

}  // namespace
}  // namespace tandem
