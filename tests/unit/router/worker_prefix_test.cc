// Worker::CachedPrefix over the blocks a worker reported and the blocks routed to it whose KV
// events are still on their way (Worker::NoteRouted).

#include <gtest/gtest.h>

#include <vector>

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

}  // namespace
}  // namespace tandem
