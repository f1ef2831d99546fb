#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/metrics/request_hooks.h"
#include "router/flow_host.h"
#include "router/inference_client.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace tandem {

class RequestFlow;

struct ClusterOptions {
  RoutingOptions routing;
  // Conditional disaggregation: prompts whose part not cached on the chosen decode worker is
  // shorter than this are prefilled on the decode worker itself, as are all prompts while every
  // prefill worker has max_prefills_per_worker prefills in flight.
  int64_t disagg_min_uncached_tokens = 32;
  int64_t max_prefills_per_worker = 16;
  absl::Duration prefill_timeout = absl::Seconds(60);
  int max_prefill_attempts = 3;
  int max_migrations = 4;
  int32_t kv_lease_ms = 60000;
  // Told every placement (routing decisions), prefill retry and migration. May be null; must
  // outlive the client.
  RouterHooks* hooks = nullptr;
};

// Counters of the orchestration, for tests, logs and metrics.
struct ClusterCounters {
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> remote_prefills{0};
  std::atomic<int64_t> local_prefills{0};
  std::atomic<int64_t> prefill_retries{0};
  std::atomic<int64_t> migrations{0};
  std::atomic<int64_t> failures{0};
};

// The router's InferenceClient for a disaggregated cluster (DESIGN §2): places each request on a
// decode worker and (conditionally) a prefill worker by the routing policy, relays the KV
// reservation to the prefill worker, retries a failed prefill on another prefill worker while
// the decode worker keeps its reservation, and migrates the samples of a decode worker that
// dies to another one with the tokens generated so far, so that the client's stream goes on
// without a gap or a repeat. Each request is a RequestFlow (router/request_flow.h), which sees
// the client only as its FlowHost. Thread-safe.
class ClusterClient : public InferenceClient, private FlowHost {
 public:
  ClusterClient(WorkerRegistry* registry, const ClusterOptions& options);
  ~ClusterClient() override;

  void Decode(const v1::DecodeRequest& request, ResponseCallback callback) override;
  void Cancel(const std::string& request_id, int32_t index) override;

  const ClusterCounters& counters() const { return counters_; }
  int64_t active_requests() const;

 private:
  // FlowHost: what the flows use.
  WorkerRegistry& registry() override { return *registry_; }
  const ClusterOptions& options() const override { return options_; }
  ClusterCounters& mutable_counters() override { return counters_; }
  RouteChoice Choose(PlacementRole role, const std::vector<RouteCandidate>& candidates,
                     int64_t prompt_blocks) override;
  // Reports a placement to the hooks under the configured policy's name.
  void RecordDecision(const char* reason) override;
  void RecordRetry(const char* role) override;
  void RecordMigration() override;
  void FlowDone(const std::string& request_id) override;

  WorkerRegistry* registry_;
  ClusterOptions options_;
  ClusterCounters counters_;
  std::atomic<uint64_t> decode_counter_{0};  // round-robin cursors of Choose
  std::atomic<uint64_t> prefill_counter_{0};
  mutable std::mutex mu_;                                                // guards flows_
  std::unordered_map<std::string, std::shared_ptr<RequestFlow>> flows_;  // by request id
};

}  // namespace tandem
