#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace tandem {

struct ClusterOptions;
struct ClusterCounters;

// Which kind of worker a placement picks; each keeps its own round-robin cursor.
enum class PlacementRole { kDecode, kPrefill };

// What a request's flow (RequestFlow) and its legs (DecodeLeg, PrefillLeg) use of the client that
// runs them: the workers, the options, the counters, the routing policy with its cursors, the
// metrics hooks and the end of a flow. ClusterClient implements it and outlives its flows. Every
// method may be called from any thread.
class FlowHost {
 public:
  virtual WorkerRegistry& registry() = 0;
  virtual const ClusterOptions& options() const = 0;
  virtual ClusterCounters& mutable_counters() = 0;
  // Picks one of `candidates` by the routing policy (ChooseWorker with `role`'s cursor).
  virtual RouteChoice Choose(PlacementRole role, const std::vector<RouteCandidate>& candidates,
                             int64_t prompt_blocks) = 0;
  // Reports to ClusterOptions::hooks (when set): a placement with its routing_reason, a call sent
  // again ("prefill" or "decode"), a mid-stream migration.
  virtual void RecordDecision(const char* reason) = 0;
  virtual void RecordRetry(const char* role) = 0;
  virtual void RecordMigration() = 0;
  // The flow of `request_id` has ended: every sample finished and every leg done.
  virtual void FlowDone(const std::string& request_id) = 0;

 protected:
  ~FlowHost() = default;
};

}  // namespace tandem
