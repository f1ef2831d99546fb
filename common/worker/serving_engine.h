#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/async_engine.h"
#include "common/engine/engine_builder.h"
#include "common/metrics/engine_metrics.h"
#include "common/metrics/kv_tier_metrics.h"
#include "common/metrics/spec_metrics.h"
#include "common/worker/kv_event_log.h"
#include "prometheus/registry.h"

namespace tandem {

// The KV cache tiers' block events into the worker's KvEventLog, with their medium.
class TierEventForwarder : public KvTierListener {
 public:
  explicit TierEventForwarder(KvEventLog* log) : log_(log) {}
  void OnTierStored(KvTier tier, BlockHash hash) override { log_->Stored(hash, MediumOf(tier)); }
  void OnTierRemoved(KvTier tier, BlockHash hash) override { log_->Removed(hash, MediumOf(tier)); }

 private:
  static KvMedium MediumOf(KvTier tier) {
    return tier == KvTier::kHost ? KvMedium::kHost : KvMedium::kDisk;
  }
  KvEventLog* log_;
};

// An engine built for a serving process (a worker, or `tandem serve` in one process): running
// on its own thread (AsyncEngine), with its metrics and the prefix-cache event log its block
// pool feeds (for the routers that watch it). Members are destroyed bottom-up: the engine
// thread stops before what it reports to.
struct ServingEngine {
  std::shared_ptr<const Model> model;
  Backend* backend = nullptr;  // owned by the engine
  int64_t max_model_len = 0;
  KvEventLog events;
  std::unique_ptr<EngineMetrics> metrics;
  std::unique_ptr<SpecMetrics> spec_metrics;    // only when speculating: no empty series otherwise
  std::unique_ptr<KvTierMetrics> tier_metrics;  // only with KV offload tiers
  std::unique_ptr<TierEventForwarder> tier_events;  // only with KV offload tiers
  std::unique_ptr<AsyncEngine> engine;
};

// Builds the engine of `options` and starts it. `role` labels its metrics and `spec_method`
// (the --speculative-method name) its speculation metrics, both in `registry`.
absl::StatusOr<std::unique_ptr<ServingEngine>> StartServingEngine(const EngineBuildOptions& options,
                                                                  const std::string& spec_method,
                                                                  prometheus::Registry* registry,
                                                                  const std::string& role);

}  // namespace tandem
