#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/routing_reason.h"
#include "router/worker_registry.h"

namespace tandem {

enum class RoutingPolicy { kRoundRobin, kLeastLoaded, kPrefixAffinity };

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(const std::string& name);
const char* RoutingPolicyName(RoutingPolicy policy);

struct RoutingOptions {
  RoutingPolicy policy = RoutingPolicy::kPrefixAffinity;
  // prefix_affinity cost = w_overlap * uncached prompt blocks + w_load * active blocks. A request
  // holds about as many active blocks as its prompt has, so with equal weights a one-request load
  // difference would outweigh a whole cached prompt: load weighs a quarter, and large imbalances
  // are left to the bound below.
  double w_overlap = 1.0;
  double w_load = 0.25;
  // Imbalance bound: a worker whose active blocks exceed max_imbalance x the least loaded
  // worker's (plus imbalance_slack_blocks) is passed over while another one is below it, so one
  // hot prefix cannot pile all the load on one worker.
  double max_imbalance = 1.25;
  // The slack is a few requests' worth: with less, the first requests of a burst alternate
  // between workers whatever their prefixes.
  int64_t imbalance_slack_blocks = 128;
  // Prompt blocks of a routed request count as cached on its worker for this long, or until the
  // worker's KV events confirm or drop them (Worker::pending).
  absl::Duration pending_block_ttl = absl::Seconds(10);
  // A prompt block a worker holds in a KV cache tier below its pool (host memory, disk) saves
  // its prefill but costs a load: it counts as 1 - load/prefill of a pool hit, from the worker's
  // own measurements of both (its tier's read cost per block, its prefill cost per block), at
  // least 0. Until a worker has measured both, a tier block counts as this much.
  double unmeasured_tier_credit = 0.5;
  // Count tier blocks as nothing (the policy before tiers; for comparisons).
  bool no_tier_credit = false;
};

struct RouteCandidate {
  std::shared_ptr<Worker> worker;
  int64_t cached_blocks = 0;  // leading prompt blocks in its prefix cache
  int64_t load_blocks = 0;    // active KV blocks (router's estimate)
  // Prompt blocks right after the cached ones that the worker holds in its KV cache tiers
  // (index: host memory, disk; Worker::TieredPrefix), and the worker's measured costs: seconds
  // to load a block from each tier, seconds to prefill one (0: not measured yet).
  std::array<int64_t, 2> tier_blocks = {0, 0};
  std::array<double, 2> tier_load_seconds = {0, 0};
  double prefill_seconds_per_block = 0;
};

// What `c`'s tier blocks are worth in pool hits (RoutingOptions::unmeasured_tier_credit).
double TierCredit(const RoutingOptions& options, const RouteCandidate& c);

struct RouteChoice {
  int index = -1;  // -1: no candidate
  // Why the candidate won: a routing_reason constant (common/metrics/routing_reason.h), the
  // `reason` label of tandem_router_routing_decisions_total.
  const char* reason = routing_reason::kNoWorker;
};

// Picks among candidates. Deterministic given the inputs and the counter. Reasons: no_worker
// (no candidate), only_candidate, round_robin, least_loaded; prefix_affinity (a cached prefix
// counts its pool blocks plus TierCredit): prefix_overlap (the winner has the longest cached
// prefix, longer than some other's), imbalance_bound (a longer
// overlap sat on a worker over the imbalance bound), load_balance (overlaps tied or none, or
// load outweighed a longer overlap).
RouteChoice ChooseWorker(const RoutingOptions& options, const std::vector<RouteCandidate>& c,
                         int64_t prompt_blocks, std::atomic<uint64_t>* round_robin_counter);

}  // namespace tandem
