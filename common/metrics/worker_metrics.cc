#include "common/metrics/worker_metrics.h"

namespace tandem {

WorkerMetrics::WorkerMetrics(prometheus::Registry* registry, std::string_view role) {
  const std::string r(role);
  active_ = &prometheus::BuildGauge()
                 .Name("tandem_worker_streams_active")
                 .Help("Worker API streams (Decode, Prefill) open on this worker.")
                 .Register(*registry)
                 .Add({{"role", r}});
  auto& requests = prometheus::BuildCounter()
                       .Name("tandem_worker_requests_total")
                       .Help("Worker API streams finished, by outcome.")
                       .Register(*registry);
  for (int o = 0; o < kNumRequestOutcomes; ++o) {
    requests_[o] = &requests.Add(
        {{"role", r}, {"outcome", RequestOutcomeName(static_cast<RequestOutcome>(o))}});
  }
  draining_ = &prometheus::BuildGauge()
                   .Name("tandem_worker_draining")
                   .Help("1 while the worker drains (refuses new work before shutting down).")
                   .Register(*registry)
                   .Add({{"role", r}});
}

void WorkerMetrics::StreamStarted() { active_->Increment(); }

void WorkerMetrics::StreamFinished(RequestOutcome outcome) {
  active_->Decrement();
  requests_[static_cast<int>(outcome)]->Increment();
}

void WorkerMetrics::SetDraining(bool draining) { draining_->Set(draining ? 1 : 0); }

}  // namespace tandem
