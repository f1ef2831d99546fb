#include "common/metrics/router_metrics.h"

#include <algorithm>

#include "common/metrics/buckets.h"

namespace tandem {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

constexpr char kNoFinishReason[] = "none";

}  // namespace

RouterMetrics::RouterMetrics(prometheus::Registry* registry) : http_(registry) {
  requests_family_ = &BuildCounter()
                          .Name("tandem_router_requests_total")
                          .Help(
                              "Client requests finished, by outcome and finish reason (the "
                              "reason of the last sample to finish; none if no sample did).")
                          .Register(*registry);
  for (int o = 0; o < kNumRequestOutcomes; ++o) {
    for (size_t r = 0; r <= kFinishReasons.size(); ++r) {
      const char* reason = r < kFinishReasons.size() ? kFinishReasons[r] : kNoFinishReason;
      requests_[o][r] =
          &requests_family_->Add({{"outcome", RequestOutcomeName(static_cast<RequestOutcome>(o))},
                                  {"finish_reason", reason}});
    }
  }
  in_flight_ = &BuildGauge()
                    .Name("tandem_router_requests_in_flight")
                    .Help("Client requests accepted and not yet finished.")
                    .Register(*registry)
                    .Add({});
  auto histogram = [&](const char* name, const char* help, const std::vector<double>& b) {
    return &BuildHistogram().Name(name).Help(help).Register(*registry).Add({}, b);
  };
  ttft_ = histogram("tandem_router_time_to_first_token_seconds",
                    "Time from a request's arrival at the router to its first token.",
                    buckets::FirstTokenSeconds());
  itl_ = histogram("tandem_router_inter_token_latency_seconds",
                   "Time between consecutive tokens of one sample, seen at the router.",
                   buckets::InterTokenSeconds());
  e2e_ = histogram("tandem_router_e2e_request_latency_seconds",
                   "Time from a request's arrival at the router to its end.",
                   buckets::RequestSeconds());
  prompt_tokens_ =
      histogram("tandem_router_request_prompt_tokens",
                "Prompt length of finished requests, in tokens.", buckets::RequestTokens());
  generation_tokens_ =
      histogram("tandem_router_request_generation_tokens",
                "Tokens generated per finished request (all samples).", buckets::RequestTokens());
  decisions_ = &BuildCounter()
                    .Name("tandem_router_routing_decisions_total")
                    .Help(
                        "Placement decisions, by routing policy and the reason the chosen "
                        "worker won.")
                    .Register(*registry);
  retries_ = &BuildCounter()
                  .Name("tandem_router_retries_total")
                  .Help(
                      "Requests re-sent to another worker after a failure or timeout, by the "
                      "role of the worker that failed.")
                  .Register(*registry);
  for (const char* role : {"prefill", "decode"}) retries_->Add({{"role", role}});
  migrations_ = &BuildCounter()
                     .Name("tandem_router_migrations_total")
                     .Help("Running requests moved to another decode worker mid-stream.")
                     .Register(*registry)
                     .Add({});
  worker_healthy_ = &BuildGauge()
                         .Name("tandem_router_worker_healthy")
                         .Help(
                             "1 when the router considers the worker healthy (serving its "
                             "gRPC health check and stats stream), else 0.")
                         .Register(*registry);
}

std::unique_ptr<RequestHooks> RouterMetrics::NewRequest(absl::Time arrival) {
  return std::make_unique<RequestTracker>(this, arrival);
}

void RouterMetrics::RequestStarted() { in_flight_->Increment(); }

void RouterMetrics::RequestFinished(RequestOutcome outcome, std::string_view finish_reason,
                                    double e2e_seconds, int64_t prompt_tokens,
                                    int64_t generation_tokens) {
  const size_t r = finish_reason.empty() || finish_reason == kNoFinishReason
                       ? kFinishReasons.size()
                       : FinishReasonIndex(finish_reason);
  requests_[static_cast<int>(outcome)][r]->Increment();
  in_flight_->Decrement();
  e2e_->Observe(e2e_seconds);
  prompt_tokens_->Observe(static_cast<double>(prompt_tokens));
  generation_tokens_->Observe(static_cast<double>(generation_tokens));
}

void RouterMetrics::RequestRejected(RequestOutcome outcome) {
  requests_[static_cast<int>(outcome)][kFinishReasons.size()]->Increment();
}

void RouterMetrics::ObserveTimeToFirstToken(double seconds) { ttft_->Observe(seconds); }

void RouterMetrics::ObserveInterTokenLatency(double seconds_per_token, int64_t tokens) {
  for (int64_t i = 0; i < tokens; ++i) itl_->Observe(seconds_per_token);
}

void RouterMetrics::RecordRoutingDecision(std::string_view policy, std::string_view reason) {
  decisions_->Add({{"policy", std::string(policy)}, {"reason", std::string(reason)}}).Increment();
}

void RouterMetrics::RecordRetry(std::string_view role) {
  retries_->Add({{"role", std::string(role)}}).Increment();
}

void RouterMetrics::RecordMigration() { migrations_->Increment(); }

void RouterMetrics::SetWorkerHealthy(std::string_view worker, std::string_view role, bool healthy) {
  worker_healthy_->Add({{"worker", std::string(worker)}, {"role", std::string(role)}})
      .Set(healthy ? 1 : 0);
}

void RouterMetrics::RemoveWorker(std::string_view worker, std::string_view role) {
  const prometheus::Labels labels = {{"worker", std::string(worker)}, {"role", std::string(role)}};
  if (worker_healthy_->Has(labels)) worker_healthy_->Remove(&worker_healthy_->Add(labels));
}

// --- RequestTracker ---

RequestTracker::RequestTracker(RouterMetrics* metrics, absl::Time arrival)
    : metrics_(metrics), arrival_(arrival) {}

void RequestTracker::Start(int32_t samples, int64_t prompt_tokens) {
  if (started_ || finished_) return;
  started_ = true;
  prompt_tokens_ = prompt_tokens;
  last_token_.assign(std::max(samples, 1), absl::InfinitePast());
  if (metrics_ != nullptr) metrics_->RequestStarted();
}

void RequestTracker::OnTokensAt(int32_t index, int64_t count, absl::Time now) {
  if (!started_ || finished_ || count <= 0 || index < 0 ||
      index >= static_cast<int32_t>(last_token_.size())) {
    return;
  }
  generated_ += count;
  if (!first_token_seen_) {
    first_token_seen_ = true;
    ttft_ = now - arrival_;
    if (metrics_ != nullptr) metrics_->ObserveTimeToFirstToken(absl::ToDoubleSeconds(ttft_));
  }
  absl::Time& last = last_token_[index];
  if (last != absl::InfinitePast()) {
    // A chunk of k tokens (speculative decoding) after a gap g counts k tokens g/k apart.
    if (metrics_ != nullptr) {
      metrics_->ObserveInterTokenLatency(absl::ToDoubleSeconds(now - last) / count, count);
    }
  }
  last = now;
}

void RequestTracker::FinishAt(RequestOutcome outcome, std::string_view finish_reason,
                              absl::Time now) {
  if (finished_) return;
  finished_ = true;
  if (metrics_ == nullptr) return;
  if (!started_) {
    metrics_->RequestRejected(outcome);
    return;
  }
  metrics_->RequestFinished(outcome, finish_reason, absl::ToDoubleSeconds(now - arrival_),
                            prompt_tokens_, generated_);
}

}  // namespace tandem
