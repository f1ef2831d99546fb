#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics/finish_reason.h"
#include "common/metrics/http_metrics.h"
#include "common/metrics/request_hooks.h"
#include "common/metrics/routing_reason.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// Metric families of the router (DESIGN §6, §7). Latencies are measured here, at the client
// boundary. Thread-safe.
//
//   tandem_router_requests_total{outcome, finish_reason}
//   tandem_router_requests_in_flight
//   tandem_router_time_to_first_token_seconds, tandem_router_inter_token_latency_seconds,
//   tandem_router_e2e_request_latency_seconds
//   tandem_router_request_prompt_tokens, tandem_router_request_generation_tokens (histograms)
//   tandem_router_routing_decisions_total{policy, reason}
//   tandem_router_retries_total{role}, tandem_router_migrations_total
//   tandem_router_worker_healthy{worker, role}
//   and the HTTP API's transport families (http_metrics.h)
class RouterMetrics : public RouterHooks {
 public:
  explicit RouterMetrics(prometheus::Registry* registry);
  RouterMetrics(const RouterMetrics&) = delete;
  RouterMetrics& operator=(const RouterMetrics&) = delete;

  // RouterHooks (RequestHooksFactory): a RequestTracker feeding these metrics.
  std::unique_ptr<RequestHooks> NewRequest(absl::Time arrival) override;
  HttpHooks* http_hooks() override { return &http_; }

  // Request lifecycle (RequestTracker calls these).
  void RequestStarted();
  void RequestFinished(RequestOutcome outcome, std::string_view finish_reason, double e2e_seconds,
                       int64_t prompt_tokens, int64_t generation_tokens);
  // A request refused before it was accepted (validation, draining): counted, not timed.
  void RequestRejected(RequestOutcome outcome);
  void ObserveTimeToFirstToken(double seconds);
  // `tokens` tokens arrived `seconds_per_token` apart on average.
  void ObserveInterTokenLatency(double seconds_per_token, int64_t tokens);

  // Placement and failures (disaggregated router).
  void RecordRoutingDecision(std::string_view policy, std::string_view reason) override;
  void RecordRetry(std::string_view role) override;  // prefill or decode
  void RecordMigration() override;
  // The router's view of one worker (1 healthy, 0 not). RemoveWorker drops the series when the
  // worker leaves discovery.
  void SetWorkerHealthy(std::string_view worker, std::string_view role, bool healthy) override;
  void RemoveWorker(std::string_view worker, std::string_view role) override;

 private:
  prometheus::Family<prometheus::Counter>* requests_family_;
  // [outcome][finish_reason], plus a "none" finish reason for requests that never produced one.
  std::array<std::array<prometheus::Counter*, kFinishReasons.size() + 1>, kNumRequestOutcomes>
      requests_;
  prometheus::Gauge* in_flight_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* prompt_tokens_;
  prometheus::Histogram* generation_tokens_;
  prometheus::Family<prometheus::Counter>* decisions_;
  prometheus::Family<prometheus::Counter>* retries_;
  prometheus::Counter* migrations_;
  prometheus::Family<prometheus::Gauge>* worker_healthy_;
  HttpMetrics http_;
};

// Per-request timing at the router: TTFT from arrival to the first token, inter-token latency
// per sample, end-to-end latency, outcome. One per Generate call; not thread-safe (the call
// holds its own lock around it). Does nothing when `metrics` is null.
class RequestTracker : public RequestHooks {
 public:
  explicit RequestTracker(RouterMetrics* metrics, absl::Time arrival = absl::Now());
  // The call was accepted; counts it in flight until Finish.
  void Start(int32_t samples, int64_t prompt_tokens) override;
  // `count` tokens of sample `index` arrived at `now`.
  void OnTokens(int32_t index, int64_t count) override { OnTokensAt(index, count, absl::Now()); }
  void OnTokensAt(int32_t index, int64_t count, absl::Time now);
  // Records the outcome once (later calls are ignored). `finish_reason` is the reason of the
  // last sample to finish, or empty when none finished.
  void Finish(RequestOutcome outcome, std::string_view finish_reason) override {
    FinishAt(outcome, finish_reason, absl::Now());
  }
  void FinishAt(RequestOutcome outcome, std::string_view finish_reason, absl::Time now);

  bool finished() const { return finished_; }
  int64_t generated_tokens() const { return generated_; }
  // Zero until the first token.
  absl::Duration time_to_first_token() const override { return ttft_; }

 private:
  RouterMetrics* metrics_;
  absl::Time arrival_;
  bool started_ = false;
  bool finished_ = false;
  bool first_token_seen_ = false;
  absl::Duration ttft_;
  int64_t prompt_tokens_ = 0;
  int64_t generated_ = 0;
  std::vector<absl::Time> last_token_;  // per sample
};

}  // namespace tandem
