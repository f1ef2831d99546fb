#include "router/routing_policy.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(const std::string& name) {
  if (name == "round_robin") return RoutingPolicy::kRoundRobin;
  if (name == "least_loaded") return RoutingPolicy::kLeastLoaded;
  if (name == "prefix_affinity") return RoutingPolicy::kPrefixAffinity;
  return absl::InvalidArgumentError(absl::StrCat(
      "routing policy must be round_robin, least_loaded or prefix_affinity, got '", name, "'"));
}

const char* RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin:
      return "round_robin";
    case RoutingPolicy::kLeastLoaded:
      return "least_loaded";
    case RoutingPolicy::kPrefixAffinity:
      return "prefix_affinity";
  }
  return "?";
}

double TierCredit(const RoutingOptions& o, const RouteCandidate& c) {
  double credit = 0;
  if (o.no_tier_credit) return 0;
  for (int t = 0; t < 2; ++t) {
    if (c.tier_blocks[t] == 0) continue;
    double per_block = o.unmeasured_tier_credit;
    if (c.tier_load_seconds[t] > 0 && c.prefill_seconds_per_block > 0) {
      per_block = std::max(0.0, 1.0 - c.tier_load_seconds[t] / c.prefill_seconds_per_block);
    }
    credit += per_block * static_cast<double>(c.tier_blocks[t]);
  }
  return credit;
}

RouteChoice ChooseWorker(const RoutingOptions& o, const std::vector<RouteCandidate>& c,
                         int64_t prompt_blocks, std::atomic<uint64_t>* counter) {
  RouteChoice choice;
  const int n = static_cast<int>(c.size());
  if (n == 0) return choice;
  if (o.policy == RoutingPolicy::kRoundRobin) {
    choice.index = static_cast<int>(counter->fetch_add(1) % n);
    choice.reason = n == 1 ? routing_reason::kOnlyCandidate : routing_reason::kRoundRobin;
    return choice;
  }
  int64_t min_load = std::numeric_limits<int64_t>::max();
  for (const auto& x : c) min_load = std::min(min_load, x.load_blocks);
  if (o.policy == RoutingPolicy::kLeastLoaded) {
    // Ties rotate so equal workers share the load.
    const uint64_t start = counter->fetch_add(1);
    for (int k = 0; k < n; ++k) {
      int i = static_cast<int>((start + k) % n);
      if (c[i].load_blocks == min_load) {
        choice.index = i;
        break;
      }
    }
    choice.reason = n == 1 ? routing_reason::kOnlyCandidate : routing_reason::kLeastLoaded;
    return choice;
  }
  // prefix_affinity with the imbalance bound.
  const double bound = o.max_imbalance * static_cast<double>(min_load) +
                       static_cast<double>(o.imbalance_slack_blocks);
  double best_cost = std::numeric_limits<double>::infinity();
  // Cached prefix per candidate: pool blocks plus what its tier blocks are worth.
  std::vector<double> cached(n);
  for (int i = 0; i < n; ++i) {
    cached[i] = static_cast<double>(c[i].cached_blocks) + TierCredit(o, c[i]);
  }
  double max_cached = 0, min_cached = std::numeric_limits<double>::infinity();
  double max_cached_in_bound = 0;
  const uint64_t start = counter->fetch_add(1);
  for (int k = 0; k < n; ++k) {
    const int i = static_cast<int>((start + k) % n);
    max_cached = std::max(max_cached, cached[i]);
    min_cached = std::min(min_cached, cached[i]);
    if (static_cast<double>(c[i].load_blocks) > bound) continue;
    max_cached_in_bound = std::max(max_cached_in_bound, cached[i]);
    const double uncached = std::max(0.0, static_cast<double>(prompt_blocks) - cached[i]);
    const double cost = o.w_overlap * uncached + o.w_load * static_cast<double>(c[i].load_blocks);
    if (cost < best_cost) {
      best_cost = cost;
      choice.index = i;
    }
  }
  if (choice.index < 0) {  // cannot happen (the least loaded is within the bound); be safe
    choice.index = 0;
  }
  if (n == 1) {
    choice.reason = routing_reason::kOnlyCandidate;
  } else if (max_cached_in_bound < max_cached) {
    choice.reason = routing_reason::kImbalanceBound;
  } else if (cached[choice.index] == max_cached && max_cached > min_cached) {
    choice.reason = routing_reason::kPrefixOverlap;
  } else {
    choice.reason = routing_reason::kLoadBalance;
  }
  return choice;
}

}  // namespace tandem
