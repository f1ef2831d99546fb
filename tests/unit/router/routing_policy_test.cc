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

}  // namespace
}  // namespace tandem
