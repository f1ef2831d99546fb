#pragma once

namespace tandem {

// Documented `reason` values of tandem_router_routing_decisions_total (docs/operations.md).
// Header-only, so that the router names them without linking the metrics library. Keep labels
// bounded: add a constant here (and to docs/operations.md) rather than passing free text.
//
// One request records a decision per placement: the decode worker (the policy's reason, or
// no_worker), whether the prompt is prefilled remotely (remote_prefill, local_prefill), and for
// remote prefills the prefill worker (the policy's reason, or no_worker when none is left and
// the decode worker prefills itself).
namespace routing_reason {
inline constexpr char kOnlyCandidate[] = "only_candidate";    // one eligible worker
inline constexpr char kRoundRobin[] = "round_robin";          // next in turn
inline constexpr char kLeastLoaded[] = "least_loaded";        // lowest load
inline constexpr char kPrefixOverlap[] = "prefix_overlap";    // best cached-prefix overlap won
inline constexpr char kLoadBalance[] = "load_balance";        // overlap tied or absent: load won
inline constexpr char kImbalanceBound[] = "imbalance_bound";  // best overlap was too loaded
inline constexpr char kRemotePrefill[] = "remote_prefill";    // prefill sent to a prefill worker
inline constexpr char kLocalPrefill[] = "local_prefill";      // decode worker prefills itself
inline constexpr char kNoWorker[] = "no_worker";              // nothing eligible
}  // namespace routing_reason

}  // namespace tandem
