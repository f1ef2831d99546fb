#include "common/engine/kv/block_pool.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::vector<int32_t> Tokens(int start, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(start + i);
  return v;
}

TEST(BlockPoolTest, AllocateReleaseAccounting) {
  BlockPool pool(4, /*enable_prefix_cache=*/false);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i) got.insert(*pool.Allocate());
  EXPECT_EQ(got.size(), 4u);
  EXPECT_FALSE(pool.Allocate().has_value());
  EXPECT_EQ(pool.num_referenced(), 4);
  pool.AddRef(2);
  pool.Release(2);
  EXPECT_EQ(pool.num_available(), 0);
  pool.Release(2);
  EXPECT_EQ(pool.num_available(), 1);
  EXPECT_EQ(*pool.Allocate(), 2);
}

TEST(BlockPoolTest, HashChainDependsOnParentTokensAndSalt) {
  auto t = Tokens(10, 16);
  uint64_t salt = HashSalt(""), other_salt = HashSalt("tenant-b");
  BlockHash a = ComputeBlockHash(kNoParentHash, t, salt);
  EXPECT_EQ(a, ComputeBlockHash(kNoParentHash, t, salt));
  EXPECT_NE(a, ComputeBlockHash(kNoParentHash, t, other_salt));
  EXPECT_NE(a, ComputeBlockHash(a, t, salt));
  t[15] = 11;
  EXPECT_NE(a, ComputeBlockHash(kNoParentHash, t, salt));
  std::vector<int32_t> two = Tokens(0, 40);
  BlockHash out[2];
  ComputeBlockHashes(two, 16, salt, out);
  EXPECT_EQ(out[1], ComputeBlockHash(out[0], absl::MakeSpan(two).subspan(16, 16), salt));
}

TEST(BlockPoolTest, CachedBlocksAreReusedThenEvictedLru) {
  BlockPool pool(3, /*enable_prefix_cache=*/true);
  std::vector<BlockHash> removed, stored;
  pool.set_listener(
      {[&](BlockHash h) { stored.push_back(h); }, [&](BlockHash h) { removed.push_back(h); }});
  uint64_t salt = HashSalt("");
  auto t0 = Tokens(0, 16), t1 = Tokens(100, 16);
  BlockHash h0 = ComputeBlockHash(kNoParentHash, t0, salt);
  BlockHash h1 = ComputeBlockHash(kNoParentHash, t1, salt);
  int32_t b0 = *pool.Allocate(), b1 = *pool.Allocate();
  EXPECT_TRUE(pool.Register(b0, h0, kNoParentHash, t0, salt));
  EXPECT_TRUE(pool.Register(b1, h1, kNoParentHash, t1, salt));
  EXPECT_EQ(stored.size(), 2u);
  pool.Release(b0);  // evictable, LRU first
  pool.Release(b1);
  EXPECT_EQ(pool.num_referenced(), 0);
  EXPECT_EQ(pool.num_available(), 3);

  // A hit takes a reference and removes the block from the LRU list.
  auto hit = pool.AcquireCached(h0, kNoParentHash, t0, salt);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, b0);
  EXPECT_EQ(pool.refcount(b0), 1);
  // Same hash but different tokens (a simulated collision) is a miss.
  EXPECT_FALSE(pool.AcquireCached(h1, kNoParentHash, t0, salt).has_value());
  // Other salt: miss.
  EXPECT_FALSE(pool.AcquireCached(h1, kNoParentHash, t1, HashSalt("x")).has_value());

  // Free block first, then the LRU evictable (b1); b0 is referenced and survives.
  int32_t fresh = *pool.Allocate();
  EXPECT_NE(fresh, b0);
  EXPECT_NE(fresh, b1);
  EXPECT_EQ(*pool.Allocate(), b1);
  EXPECT_EQ(removed, std::vector<BlockHash>{h1});
  EXPECT_FALSE(pool.IsCached(h1));
  EXPECT_TRUE(pool.IsCached(h0));
  EXPECT_FALSE(pool.Allocate().has_value());
}

TEST(BlockPoolTest, DuplicateRegistrationKeepsTheFirstBlock) {
  BlockPool pool(2, true);
  uint64_t salt = HashSalt("");
  auto t = Tokens(0, 16);
  BlockHash h = ComputeBlockHash(kNoParentHash, t, salt);
  int32_t a = *pool.Allocate(), b = *pool.Allocate();
  EXPECT_TRUE(pool.Register(a, h, kNoParentHash, t, salt));
  EXPECT_FALSE(pool.Register(b, h, kNoParentHash, t, salt));
  pool.Release(b);
  EXPECT_EQ(pool.num_evictable(), 0);  // b was never cached: it is free
  EXPECT_EQ(pool.num_available(), 1);
  pool.Release(a);
  pool.ClearCache();
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_available(), 2);
}

}  // namespace
}  // namespace tandem
