// Worker::CachedPrefix over the blocks a worker reported and the blocks routed to it whose KV
// events are still on their way (Worker::NoteRouted).

#include <gtest/gtest.h>

#include <vector>

#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace tandem {
namespace {

TEST(WorkerPrefixTest, CountsLeadingReportedBlocksOnly) {
  Worker w;
  w.cached = {1, 2, 4};
  const absl::Time now = absl::Now();
  EXPECT_EQ(w.CachedPrefix({1, 2, 3, 4}, now), 2);
  EXPECT_EQ(w.CachedPrefix({3, 1}, now), 0);
  EXPECT_EQ(w.CachedPrefix({}, now), 0);
}

TEST(WorkerPrefixTest, RoutedBlocksCountUntilTheyExpire) {
  Worker w;
  w.cached = {1};
  const absl::Time now = absl::Now();
  w.NoteRouted({1, 2, 3}, now + absl::Seconds(10));
  EXPECT_EQ(w.CachedPrefix({1, 2, 3, 4}, now), 3);
  EXPECT_EQ(w.CachedPrefix({1, 2, 3, 4}, now + absl::Seconds(9)), 3);
  EXPECT_EQ(w.CachedPrefix({1, 2, 3, 4}, now + absl::Seconds(10)), 1) << "expired";
  // A reported block is not re-marked pending.
  EXPECT_EQ(w.pending.count(1), 0u);
}

TEST(WorkerPrefixTest, RoutingAgainRefreshesTheExpiry) {
  Worker w;
  const absl::Time now = absl::Now();
  w.NoteRouted({7}, now + absl::Seconds(1));
  w.NoteRouted({7}, now + absl::Seconds(5));
  EXPECT_EQ(w.CachedPrefix({7}, now + absl::Seconds(3)), 1);
}

TEST(WorkerPrefixTest, TieredPrefixContinuesPastThePoolUntilNoTierHoldsABlock) {
  Worker w;
  w.cached = {1, 2};
  w.tiered[0] = {3, 5};     // host
  w.tiered[1] = {3, 4, 7};  // disk (3 in both: counted once, as host)
  v1::KvTierEvents* host = w.stats.add_tier_events();
  host->set_medium(v1::KV_MEDIUM_HOST);
  host->set_load_seconds_per_block(0.001);
  v1::KvTierEvents* disk = w.stats.add_tier_events();
  disk->set_medium(v1::KV_MEDIUM_DISK);
  disk->set_load_seconds_per_block(0.004);
  w.stats.set_prefill_seconds_per_block(0.02);
  RouteCandidate c;
  c.cached_blocks = w.CachedPrefix({1, 2, 3, 4, 5, 6, 7}, absl::Now());
  ASSERT_EQ(c.cached_blocks, 2);
  w.TieredPrefix({1, 2, 3, 4, 5, 6, 7}, &c);
  EXPECT_EQ(c.tier_blocks[0], 2);  // 3, 5
  EXPECT_EQ(c.tier_blocks[1], 1);  // 4; 6 is nowhere, so 7 does not count
  EXPECT_DOUBLE_EQ(c.tier_load_seconds[0], 0.001);
  EXPECT_DOUBLE_EQ(c.tier_load_seconds[1], 0.004);
  EXPECT_DOUBLE_EQ(c.prefill_seconds_per_block, 0.02);
  // Tier blocks never count before the pool prefix ends.
  RouteCandidate none;
  w.TieredPrefix({4, 5}, &none);
  EXPECT_EQ(none.tier_blocks[0] + none.tier_blocks[1], 2);
  RouteCandidate gap;
  w.TieredPrefix({6, 3}, &gap);
  EXPECT_EQ(gap.tier_blocks[0] + gap.tier_blocks[1], 0);
}

}  // namespace
}  // namespace tandem
