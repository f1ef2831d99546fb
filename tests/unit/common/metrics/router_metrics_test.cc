#include "common/metrics/router_metrics.h"

#include <gtest/gtest.h>

#include "common/metrics/metric_reader.h"

namespace tandem {
namespace {

double Requests(const prometheus::Registry& r, const char* outcome, const char* reason) {
  return ReadMetric(r, "tandem_router_requests_total",
                    {{"outcome", outcome}, {"finish_reason", reason}})
      .value_or(-1);
}

TEST(RouterMetricsTest, EveryOutcomeAndReasonExistsAtZero) {
  prometheus::Registry registry;
  RouterMetrics metrics(&registry);
  for (const char* o : {"ok", "cancelled", "invalid", "rejected", "timeout", "error"}) {
    for (const char* r : {"stop", "length", "abort", "error", "none"}) {
      EXPECT_EQ(Requests(registry, o, r), 0) << o << " " << r;
    }
  }
  EXPECT_EQ(ReadMetric(registry, "tandem_router_requests_in_flight"), 0);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_migrations_total"), 0);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_retries_total", {{"role", "prefill"}}), 0);
  // Lazily labelled families have no series until used.
  EXPECT_FALSE(ReadMetric(registry, "tandem_router_routing_decisions_total").has_value());
  EXPECT_FALSE(ReadMetric(registry, "tandem_router_worker_healthy").has_value());
}

TEST(RouterMetricsTest, OutcomeForStatusCode) {
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kOk), RequestOutcome::kOk);
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kCancelled), RequestOutcome::kCancelled);
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kInvalidArgument), RequestOutcome::kInvalid);
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kNotFound), RequestOutcome::kInvalid);
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kResourceExhausted), RequestOutcome::kRejected);
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kUnavailable), RequestOutcome::kRejected);
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kDeadlineExceeded), RequestOutcome::kTimeout);
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kInternal), RequestOutcome::kError);
  EXPECT_EQ(OutcomeForStatusCode(absl::StatusCode::kDataLoss), RequestOutcome::kError);
  EXPECT_STREQ(RequestOutcomeName(RequestOutcome::kRejected), "rejected");
}

TEST(RouterMetricsTest, TrackerMeasuresTtftItlAndE2e) {
  prometheus::Registry registry;
  RouterMetrics metrics(&registry);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  RequestTracker tracker(&metrics, t0);
  tracker.Start(/*samples=*/2, /*prompt_tokens=*/12);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_requests_in_flight"), 1);
  tracker.OnTokensAt(0, 1, t0 + absl::Milliseconds(250));  // TTFT 0.25 s
  tracker.OnTokensAt(1, 1, t0 + absl::Milliseconds(260));  // sample 1's first token: no ITL
  tracker.OnTokensAt(0, 1, t0 + absl::Milliseconds(270));  // ITL 0.02
  tracker.OnTokensAt(0, 2, t0 + absl::Milliseconds(310));  // two tokens 0.02 apart
  tracker.OnTokensAt(1, 1, t0 + absl::Milliseconds(300));  // ITL 0.04
  EXPECT_EQ(tracker.time_to_first_token(), absl::Milliseconds(250));
  tracker.FinishAt(RequestOutcome::kOk, "length", t0 + absl::Seconds(2));
  tracker.FinishAt(RequestOutcome::kError, "error", t0 + absl::Seconds(3));  // ignored

  auto ttft = ReadHistogram(registry, "tandem_router_time_to_first_token_seconds");
  ASSERT_TRUE(ttft.has_value());
  EXPECT_EQ(ttft->count, 1u);
  EXPECT_NEAR(ttft->sum, 0.25, 1e-9);
  auto itl = ReadHistogram(registry, "tandem_router_inter_token_latency_seconds");
  ASSERT_TRUE(itl.has_value());
  EXPECT_EQ(itl->count, 4u);
  EXPECT_NEAR(itl->sum, 0.02 + 0.04 + 0.04, 1e-9);
  auto e2e = ReadHistogram(registry, "tandem_router_e2e_request_latency_seconds");
  EXPECT_EQ(e2e->count, 1u);
  EXPECT_NEAR(e2e->sum, 2.0, 1e-9);
  EXPECT_EQ(ReadHistogram(registry, "tandem_router_request_prompt_tokens")->sum, 12);
  EXPECT_EQ(ReadHistogram(registry, "tandem_router_request_generation_tokens")->sum, 6);
  EXPECT_EQ(Requests(registry, "ok", "length"), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_requests_total"), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_requests_in_flight"), 0);
}

TEST(RouterMetricsTest, RejectedBeforeStartIsCountedNotTimed) {
  prometheus::Registry registry;
  RouterMetrics metrics(&registry);
  RequestTracker tracker(&metrics);
  tracker.Finish(RequestOutcome::kInvalid, "");
  EXPECT_EQ(Requests(registry, "invalid", "none"), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_requests_in_flight"), 0);
  EXPECT_EQ(ReadHistogram(registry, "tandem_router_e2e_request_latency_seconds")->count, 0u);
}

TEST(RouterMetricsTest, NullMetricsTrackerStillTracks) {
  RequestTracker tracker(nullptr, absl::FromUnixSeconds(5));
  tracker.Start(1, 3);
  tracker.OnTokensAt(0, 2, absl::FromUnixSeconds(6));
  tracker.Finish(RequestOutcome::kOk, "stop");
  EXPECT_TRUE(tracker.finished());
  EXPECT_EQ(tracker.generated_tokens(), 2);
  EXPECT_EQ(tracker.time_to_first_token(), absl::Seconds(1));
}

TEST(RouterMetricsTest, HooksFactoryMakesTrackers) {
  prometheus::Registry registry;
  RouterMetrics metrics(&registry);
  RequestHooksFactory* factory = &metrics;  // what GenerationService holds
  std::unique_ptr<RequestHooks> a = factory->NewRequest(absl::Now() - absl::Milliseconds(5));
  std::unique_ptr<RequestHooks> b = factory->NewRequest(absl::Now());
  a->Start(1, 4);
  b->Start(1, 4);
  a->OnTokens(0, 1);
  EXPECT_GE(a->time_to_first_token(), absl::Milliseconds(5));
  EXPECT_EQ(b->time_to_first_token(), absl::ZeroDuration());
  EXPECT_EQ(ReadMetric(registry, "tandem_router_requests_in_flight"), 2);
  a->Finish(OutcomeForStatusCode(absl::StatusCode::kOk), "stop");
  b->Finish(OutcomeForStatusCode(absl::StatusCode::kCancelled), "abort");
  EXPECT_EQ(Requests(registry, "ok", "stop"), 1);
  EXPECT_EQ(Requests(registry, "cancelled", "abort"), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_requests_in_flight"), 0);
}

TEST(RouterMetricsTest, DecisionsRetriesMigrationsAndWorkerHealth) {
  prometheus::Registry registry;
  RouterMetrics metrics(&registry);
  metrics.RecordRoutingDecision("prefix_affinity", routing_reason::kPrefixOverlap);
  metrics.RecordRoutingDecision("prefix_affinity", routing_reason::kPrefixOverlap);
  metrics.RecordRoutingDecision("prefix_affinity", routing_reason::kImbalanceBound);
  metrics.RecordRetry("prefill");
  metrics.RecordMigration();
  metrics.SetWorkerHealthy("10.0.0.1:50061", "decode", true);
  metrics.SetWorkerHealthy("10.0.0.2:50061", "decode", false);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_routing_decisions_total",
                       {{"policy", "prefix_affinity"}, {"reason", "prefix_overlap"}}),
            2);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_routing_decisions_total"), 3);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_retries_total", {{"role", "prefill"}}), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_migrations_total"), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_worker_healthy", {{"role", "decode"}}), 1);
  metrics.SetWorkerHealthy("10.0.0.2:50061", "decode", true);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_worker_healthy"), 2);
  metrics.RemoveWorker("10.0.0.2:50061", "decode");
  metrics.RemoveWorker("10.0.0.9:50061", "decode");  // unknown: no-op
  EXPECT_FALSE(
      ReadMetric(registry, "tandem_router_worker_healthy", {{"worker", "10.0.0.2:50061"}}));
  EXPECT_EQ(ReadMetric(registry, "tandem_router_worker_healthy"), 1);
}

}  // namespace
}  // namespace tandem
