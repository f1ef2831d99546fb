#include "common/metrics/transfer_metrics.h"

#include "common/metrics/buckets.h"

namespace tandem {
namespace {

constexpr std::array<const char*, 2> kDirectionNames = {"send", "receive"};

}  // namespace

TransferMetrics::TransferMetrics(prometheus::Registry* registry, std::string_view transport) {
  auto& seconds = prometheus::BuildHistogram()
                      .Name("tandem_kv_transfer_duration_seconds")
                      .Help("Time to move one request's KV blocks between workers.")
                      .Register(*registry);
  auto& bytes = prometheus::BuildHistogram()
                    .Name("tandem_kv_transfer_size_bytes")
                    .Help("Bytes of KV cache moved per request.")
                    .Register(*registry);
  auto& blocks = prometheus::BuildCounter()
                     .Name("tandem_kv_transfer_blocks_total")
                     .Help("KV cache blocks moved between workers.")
                     .Register(*registry);
  auto& in_flight = prometheus::BuildGauge()
                        .Name("tandem_kv_transfers_in_flight")
                        .Help("KV transfers started and not yet finished.")
                        .Register(*registry);
  auto& failures = prometheus::BuildCounter()
                       .Name("tandem_kv_transfer_failures_total")
                       .Help("KV transfers that failed, by reason.")
                       .Register(*registry);
  auto& refused = prometheus::BuildCounter()
                      .Name("tandem_kv_transfer_connections_refused_total")
                      .Help(
                          "KV data connections refused by the refusing side: at their "
                          "handshake (layout mismatch, failed shared-secret authentication), "
                          "for a receiver's limit (connections, memory, handshake deadline), "
                          "or transfer messages from a sender not named for the transfer.")
                      .Register(*registry);
  auto& control = prometheus::BuildHistogram()
                      .Name("tandem_kv_transfer_control_messages")
                      .Help(
                          "Control messages per KV transfer attempt (nccl, cuda-ipc), counted by "
                          "the sender: to_receiver (requests), to_sender (replies).")
                      .Register(*registry);
  const prometheus::Histogram::BucketBoundaries control_buckets = {1, 2, 3, 4, 6, 8, 16, 32, 64};
  control_to_receiver_ = &control.Add(
      {{"transport", std::string(transport)}, {"flow", "to_receiver"}}, control_buckets);
  control_to_sender_ =
      &control.Add({{"transport", std::string(transport)}, {"flow", "to_sender"}}, control_buckets);
  for (int d = 0; d < 2; ++d) {
    const prometheus::Labels l = {{"transport", std::string(transport)},
                                  {"direction", kDirectionNames[d]}};
    PerDirection& p = directions_[d];
    p.seconds = &seconds.Add(l, buckets::TransferSeconds());
    p.bytes = &bytes.Add(l, buckets::TransferBytes());
    p.blocks = &blocks.Add(l);
    p.in_flight = &in_flight.Add(l);
    for (int f = 0; f < kNumTransferFailures; ++f) {
      prometheus::Labels lf = l;
      lf["reason"] = TransferFailureName(static_cast<TransferFailure>(f));
      p.failures[f] = &failures.Add(lf);
    }
    prometheus::Labels lr = l;
    lr["reason"] = TransferFailureName(TransferFailure::kIncompatible);
    p.refused_incompatible = &refused.Add(lr);
    lr["reason"] = TransferFailureName(TransferFailure::kUnauthenticated);
    p.refused_unauthenticated = &refused.Add(lr);
    for (int r = 0; r < kNumKvRefusals; ++r) {
      lr["reason"] = KvRefusalName(static_cast<KvRefusal>(r));
      p.refused_limits[r] = &refused.Add(lr);
    }
  }
}

void TransferMetrics::TransferStarted(TransferDirection direction) {
  directions_[static_cast<int>(direction)].in_flight->Increment();
}

void TransferMetrics::TransferSucceeded(TransferDirection direction, double seconds, int64_t bytes,
                                        int64_t blocks) {
  PerDirection& p = directions_[static_cast<int>(direction)];
  p.in_flight->Decrement();
  p.seconds->Observe(seconds);
  p.bytes->Observe(static_cast<double>(bytes));
  p.blocks->Increment(static_cast<double>(blocks));
}

void TransferMetrics::TransferFailed(TransferDirection direction, TransferFailure reason) {
  PerDirection& p = directions_[static_cast<int>(direction)];
  p.in_flight->Decrement();
  p.failures[static_cast<int>(reason)]->Increment();
}

void TransferMetrics::ConnectionRefused(TransferDirection direction, TransferFailure reason) {
  PerDirection& p = directions_[static_cast<int>(direction)];
  if (reason == TransferFailure::kIncompatible) p.refused_incompatible->Increment();
  if (reason == TransferFailure::kUnauthenticated) p.refused_unauthenticated->Increment();
}

void TransferMetrics::Refused(TransferDirection direction, KvRefusal reason) {
  directions_[static_cast<int>(direction)].refused_limits[static_cast<int>(reason)]->Increment();
}

void TransferMetrics::ControlMessages(int64_t to_receiver, int64_t to_sender) {
  control_to_receiver_->Observe(static_cast<double>(to_receiver));
  control_to_sender_->Observe(static_cast<double>(to_sender));
}

}  // namespace tandem
