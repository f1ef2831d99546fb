// ChooseWorker's choices and the routing_reason each reports (the `reason` label of
// tandem_router_routing_decisions_total).

#include "router/routing_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

// Candidates with (cached prefix blocks, load blocks) each.
std::vector<RouteCandidate> Make(const std::vector<std::pair<int64_t, int64_t>>& cached_load) {
  std::vector<RouteCandidate> c;
  for (const auto& [cached, load] : cached_load) {
    RouteCandidate x;
    x.worker = std::make_shared<Worker>();
    x.cached_blocks = cached;
    x.load_blocks = load;
    c.push_back(std::move(x));
  }
  return c;
}

RoutingOptions Policy(RoutingPolicy policy) {
  RoutingOptions o;
  o.policy = policy;
  o.w_load = 1;  // w_overlap = w_load = 1, bound 1.25 x least loaded + 8 blocks
  o.imbalance_slack_blocks = 8;
  return o;
}

TEST(RoutingPolicyTest, NoCandidateAndOnlyCandidate) {
  std::atomic<uint64_t> counter{0};
  for (RoutingPolicy p :
       {RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastLoaded, RoutingPolicy::kPrefixAffinity}) {
    RouteChoice none = ChooseWorker(Policy(p), {}, 4, &counter);
    EXPECT_EQ(none.index, -1);
    EXPECT_STREQ(none.reason, routing_reason::kNoWorker);
    RouteChoice one = ChooseWorker(Policy(p), Make({{3, 100}}), 4, &counter);
    EXPECT_EQ(one.index, 0);
    EXPECT_STREQ(one.reason, routing_reason::kOnlyCandidate) << RoutingPolicyName(p);
  }
}

TEST(RoutingPolicyTest, RoundRobinAndLeastLoaded) {
  std::atomic<uint64_t> counter{0};
  const auto c = Make({{0, 5}, {0, 1}, {0, 9}});
  RouteChoice rr = ChooseWorker(Policy(RoutingPolicy::kRoundRobin), c, 4, &counter);
  EXPECT_EQ(rr.index, 0);
  EXPECT_STREQ(rr.reason, routing_reason::kRoundRobin);
  EXPECT_EQ(ChooseWorker(Policy(RoutingPolicy::kRoundRobin), c, 4, &counter).index, 1);
  RouteChoice ll = ChooseWorker(Policy(RoutingPolicy::kLeastLoaded), c, 4, &counter);
  EXPECT_EQ(ll.index, 1);
  EXPECT_STREQ(ll.reason, routing_reason::kLeastLoaded);
}

TEST(RoutingPolicyTest, PrefixAffinityReasons) {
  std::atomic<uint64_t> counter{0};
  const RoutingOptions o = Policy(RoutingPolicy::kPrefixAffinity);
  // The longest overlap wins.
  RouteChoice overlap = ChooseWorker(o, Make({{0, 10}, {6, 10}}), 8, &counter);
  EXPECT_EQ(overlap.index, 1);
  EXPECT_STREQ(overlap.reason, routing_reason::kPrefixOverlap);
  // No overlap anywhere, or the same everywhere: load decides.
  RouteChoice none = ChooseWorker(o, Make({{0, 10}, {0, 4}}), 8, &counter);
  EXPECT_EQ(none.index, 1);
  EXPECT_STREQ(none.reason, routing_reason::kLoadBalance);
  RouteChoice tied = ChooseWorker(o, Make({{3, 10}, {3, 4}}), 8, &counter);
  EXPECT_EQ(tied.index, 1);
  EXPECT_STREQ(tied.reason, routing_reason::kLoadBalance);
  // Overlap outweighs a little more load (cost 6 + 10 < 8 + 11).
  RouteChoice light = ChooseWorker(o, Make({{2, 10}, {0, 11}}), 8, &counter);
  EXPECT_EQ(light.index, 0);
  EXPECT_STREQ(light.reason, routing_reason::kPrefixOverlap);
  // Load outweighs a longer overlap (cost 4 + 10 > 8 + 4), both within the bound.
  RouteChoice heavy = ChooseWorker(o, Make({{4, 10}, {0, 4}}), 8, &counter);
  EXPECT_EQ(heavy.index, 1);
  EXPECT_STREQ(heavy.reason, routing_reason::kLoadBalance);
  // The best overlap sits on a worker over the imbalance bound (40 > 1.25 x 20 + 8).
  RouteChoice bound = ChooseWorker(o, Make({{8, 40}, {0, 20}}), 8, &counter);
  EXPECT_EQ(bound.index, 1);
  EXPECT_STREQ(bound.reason, routing_reason::kImbalanceBound);
}

// A candidate with `pool` cached blocks, then `host` and `disk` blocks in its KV cache tiers, with
// measured costs (seconds per block; 0: not measured).
RouteCandidate Tiered(int64_t pool, int64_t host, int64_t disk, int64_t load, double host_load,
                      double disk_load, double prefill) {
  RouteCandidate x = Make({{pool, load}})[0];
  x.tier_blocks = {host, disk};
  x.tier_load_seconds = {host_load, disk_load};
  x.prefill_seconds_per_block = prefill;
  return x;
}

TEST(RoutingPolicyTest, TierBlocksAreCreditedByMeasuredLoadCostAgainstPrefill) {
  const RoutingOptions o = Policy(RoutingPolicy::kPrefixAffinity);
  // Host loads cost a tenth of a prefill, disk loads half: 4 x 0.9 + 2 x 0.5.
  EXPECT_DOUBLE_EQ(TierCredit(o, Tiered(3, 4, 2, 0, 0.001, 0.005, 0.01)), 4 * 0.9 + 2 * 0.5);
  // A tier slower than prefilling is worth nothing (never negative).
  EXPECT_DOUBLE_EQ(TierCredit(o, Tiered(0, 0, 5, 0, 0, 0.02, 0.01)), 0.0);
  // Not measured yet (no load, or no prefill): the prior.
  EXPECT_DOUBLE_EQ(TierCredit(o, Tiered(0, 2, 2, 0, 0, 0.005, 0)), 4 * o.unmeasured_tier_credit);
  EXPECT_DOUBLE_EQ(TierCredit(o, Tiered(0, 0, 0, 0, 0.001, 0.005, 0.01)), 0.0);
  RoutingOptions pool_only = o;
  pool_only.no_tier_credit = true;
  EXPECT_DOUBLE_EQ(TierCredit(pool_only, Tiered(3, 4, 2, 0, 0.001, 0.005, 0.01)), 0.0);
}

TEST(RoutingPolicyTest, PrefixAffinityFollowsAPrefixInALowerTier) {
  std::atomic<uint64_t> counter{0};
  const RoutingOptions o = Policy(RoutingPolicy::kPrefixAffinity);
  // Worker 1 holds the whole 8-block prompt on disk, loads cheap against prefill: it wins over
  // an empty, slightly less loaded worker (cost 8 + 3 vs 8 - 7.2 + 4).
  std::vector<RouteCandidate> c = {Tiered(0, 0, 0, 3, 0, 0, 0), Tiered(0, 0, 8, 4, 0, 0.001, 0.01)};
  RouteChoice disk = ChooseWorker(o, c, 8, &counter);
  EXPECT_EQ(disk.index, 1);
  EXPECT_STREQ(disk.reason, routing_reason::kPrefixOverlap);
  // The same blocks whose load costs as much as prefilling them are worth nothing: load decides.
  c[1].tier_load_seconds[1] = 0.01;
  RouteChoice slow = ChooseWorker(o, c, 8, &counter);
  EXPECT_EQ(slow.index, 0);
  EXPECT_STREQ(slow.reason, routing_reason::kLoadBalance);
  // Pool blocks beat the same number of tier blocks.
  std::vector<RouteCandidate> d = {Tiered(6, 0, 0, 4, 0, 0, 0.01),
                                   Tiered(0, 6, 0, 4, 0.002, 0, 0.01)};
  EXPECT_EQ(ChooseWorker(o, d, 8, &counter).index, 0);
  // Host-tier blocks on top of a shorter pool prefix beat a longer pool prefix alone when they
  // are cheap enough: 2 + 5 x 0.9 = 6.5 > 6.
  d[1].cached_blocks = 2;
  d[1].tier_blocks = {5, 0};
  d[1].tier_load_seconds = {0.001, 0};
  EXPECT_EQ(ChooseWorker(o, d, 8, &counter).index, 1);
}

}  // namespace
}  // namespace tandem
