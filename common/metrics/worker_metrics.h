#pragma once

#include <array>
#include <string>
#include <string_view>

#include "common/metrics/request_hooks.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace tandem {

// Metric families of a worker's gRPC service (prefill, decode or both), labelled by role.
// The engine inside the worker has its own EngineMetrics. The service calls it through
// WorkerHooks (request_hooks.h). Thread-safe.
//
//   tandem_worker_streams_active{role}           Decode/Prefill streams open on this worker
//   tandem_worker_requests_total{role, outcome}  worker API calls finished, by outcome
//   tandem_worker_draining{role}                 1 while the worker refuses new work (SIGTERM)
class WorkerMetrics : public WorkerHooks {
 public:
  WorkerMetrics(prometheus::Registry* registry, std::string_view role);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  void StreamStarted() override;
  void StreamFinished(RequestOutcome outcome) override;
  void SetDraining(bool draining) override;

 private:
  prometheus::Gauge* active_;
  std::array<prometheus::Counter*, kNumRequestOutcomes> requests_;
  prometheus::Gauge* draining_;
};

}  // namespace tandem
