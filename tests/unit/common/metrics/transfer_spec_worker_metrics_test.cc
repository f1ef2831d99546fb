#include <gtest/gtest.h>

#include "common/metrics/metric_reader.h"
#include "common/metrics/router_metrics.h"
#include "common/metrics/spec_metrics.h"
#include "common/metrics/transfer_metrics.h"
#include "common/metrics/worker_metrics.h"

namespace tandem {
namespace {

TEST(TransferMetricsTest, SuccessesAndFailuresPerDirection) {
  prometheus::Registry registry;
  TransferMetrics metrics(&registry, "tcp");
  // Every failure reason exists from the start in both directions.
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfer_failures_total",
                       {{"direction", "receive"}, {"reason", "checksum"}}),
            0);
  metrics.TransferStarted(TransferDirection::kSend);
  metrics.TransferStarted(TransferDirection::kSend);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfers_in_flight", {{"direction", "send"}}), 2);
  metrics.TransferSucceeded(TransferDirection::kSend, 0.004, 1 << 20, 8);
  metrics.TransferFailed(TransferDirection::kSend, TransferFailure::kTimeout);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfers_in_flight"), 0);
  auto seconds = ReadHistogram(registry, "tandem_kv_transfer_duration_seconds",
                               {{"transport", "tcp"}, {"direction", "send"}});
  ASSERT_TRUE(seconds.has_value());
  EXPECT_EQ(seconds->count, 1u);
  EXPECT_DOUBLE_EQ(seconds->sum, 0.004);
  EXPECT_EQ(ReadHistogram(registry, "tandem_kv_transfer_size_bytes")->sum, 1 << 20);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfer_blocks_total"), 8);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfer_failures_total", {{"reason", "timeout"}}), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfer_failures_total"), 1);
  EXPECT_STREQ(TransferFailureName(TransferFailure::kIncompatible), "incompatible");
}

TEST(SpecMetricsTest, AcceptanceCountersAndLength) {
  prometheus::Registry registry;
  SpecMetrics metrics(&registry, "ngram");
  metrics.OnVerification(4, 3);
  metrics.OnVerification(4, 0);
  EXPECT_EQ(ReadMetric(registry, "tandem_spec_draft_tokens_total", {{"proposer", "ngram"}}), 8);
  EXPECT_EQ(ReadMetric(registry, "tandem_spec_accepted_tokens_total"), 3);
  EXPECT_EQ(ReadMetric(registry, "tandem_spec_verifications_total"), 2);
  auto length = ReadHistogram(registry, "tandem_spec_acceptance_length");
  ASSERT_TRUE(length.has_value());
  EXPECT_EQ(length->count, 2u);
  EXPECT_EQ(length->buckets[0], std::make_pair(0.0, uint64_t{1}));  // one accepted nothing
}

TEST(WorkerMetricsTest, StreamsOutcomesAndDraining) {
  prometheus::Registry registry;
  WorkerMetrics metrics(&registry, "decode");
  metrics.StreamStarted();
  metrics.StreamStarted();
  EXPECT_EQ(ReadMetric(registry, "tandem_worker_streams_active"), 2);
  metrics.StreamFinished(RequestOutcome::kOk);
  metrics.StreamFinished(RequestOutcome::kCancelled);
  EXPECT_EQ(ReadMetric(registry, "tandem_worker_streams_active"), 0);
  EXPECT_EQ(ReadMetric(registry, "tandem_worker_requests_total", {{"outcome", "cancelled"}}), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_worker_requests_total", {{"role", "decode"}}), 2);
  EXPECT_EQ(ReadMetric(registry, "tandem_worker_draining"), 0);
  metrics.SetDraining(true);
  EXPECT_EQ(ReadMetric(registry, "tandem_worker_draining"), 1);
}

TEST(HooksTest, ComponentsReachTheMetricsThroughHeaderOnlyInterfaces) {
  prometheus::Registry registry;
  TransferMetrics transfer(&registry, "nccl");
  SpecMetrics spec(&registry, "draft");
  WorkerMetrics worker(&registry, "prefill");
  RouterMetrics router(&registry);
  TransferHooks* t = &transfer;
  SpecHooks* s = &spec;
  WorkerHooks* w = &worker;
  RouterHooks* r = &router;
  t->TransferStarted(TransferDirection::kReceive);
  t->TransferFailed(TransferDirection::kReceive, TransferFailure::kIncompatible);
  t->ConnectionRefused(TransferDirection::kReceive, TransferFailure::kUnauthenticated);
  t->ConnectionRefused(TransferDirection::kReceive, TransferFailure::kUnauthenticated);
  t->ConnectionRefused(TransferDirection::kSend, TransferFailure::kIncompatible);
  t->ConnectionRefused(TransferDirection::kSend, TransferFailure::kTimeout);  // not a refusal
  s->OnVerification(5, 5);
  w->StreamStarted();
  w->SetDraining(true);
  r->RecordRoutingDecision("least_loaded", routing_reason::kLeastLoaded);
  r->RecordRetry("decode");
  r->SetWorkerHealthy("w0", "prefill", false);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfer_failures_total",
                       {{"transport", "nccl"}, {"reason", "incompatible"}}),
            1);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfer_connections_refused_total",
                       {{"direction", "receive"}, {"reason", "unauthenticated"}}),
            2);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfer_connections_refused_total",
                       {{"direction", "send"}, {"reason", "incompatible"}}),
            1);
  EXPECT_EQ(ReadMetric(registry, "tandem_kv_transfer_connections_refused_total",
                       {{"direction", "send"}, {"reason", "unauthenticated"}}),
            0);
  EXPECT_EQ(ReadMetric(registry, "tandem_spec_accepted_tokens_total", {{"proposer", "draft"}}), 5);
  EXPECT_EQ(ReadMetric(registry, "tandem_worker_streams_active", {{"role", "prefill"}}), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_worker_draining"), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_routing_decisions_total",
                       {{"policy", "least_loaded"}, {"reason", "least_loaded"}}),
            1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_retries_total", {{"role", "decode"}}), 1);
  EXPECT_EQ(ReadMetric(registry, "tandem_router_worker_healthy", {{"worker", "w0"}}), 0);
}

}  // namespace
}  // namespace tandem
