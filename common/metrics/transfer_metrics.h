#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtransfer/transfer_hooks.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// Metric families of kvtransfer (DESIGN §5) for one transport (tcp, nccl, loopback), labelled
// by transport and direction. Thread-safe.
//
//   tandem_kv_transfer_duration_seconds{transport, direction}   one request's KV, start to done
//   tandem_kv_transfer_size_bytes{transport, direction}         bytes moved per request
//   tandem_kv_transfer_blocks_total{transport, direction}       KV blocks moved
//   tandem_kv_transfers_in_flight{transport, direction}
//   tandem_kv_transfer_failures_total{transport, direction, reason}
//   tandem_kv_transfer_connections_refused_total{transport, direction, reason}
//       reason: incompatible or unauthenticated (handshakes), connection_limit,
//       peer_connection_limit, handshake_timeout, memory, not_named (KvRefusal)
//   tandem_kv_transfer_control_messages{transport, flow}          per attempt (nccl, cuda-ipc),
//       counted by the sender; flow: to_receiver (requests), to_sender (replies)
class TransferMetrics : public TransferHooks {
 public:
  TransferMetrics(prometheus::Registry* registry, std::string_view transport);
  TransferMetrics(const TransferMetrics&) = delete;
  TransferMetrics& operator=(const TransferMetrics&) = delete;

  void TransferStarted(TransferDirection direction) override;
  void TransferSucceeded(TransferDirection direction, double seconds, int64_t bytes,
                         int64_t blocks) override;
  void TransferFailed(TransferDirection direction, TransferFailure reason) override;
  void ConnectionRefused(TransferDirection direction, TransferFailure reason) override;
  void Refused(TransferDirection direction, KvRefusal reason) override;
  void ControlMessages(int64_t to_receiver, int64_t to_sender) override;

 private:
  struct PerDirection {
    prometheus::Histogram* seconds;
    prometheus::Histogram* bytes;
    prometheus::Counter* blocks;
    prometheus::Gauge* in_flight;
    std::array<prometheus::Counter*, kNumTransferFailures> failures;
    prometheus::Counter* refused_incompatible;
    prometheus::Counter* refused_unauthenticated;
    std::array<prometheus::Counter*, kNumKvRefusals> refused_limits;
  };
  std::array<PerDirection, 2> directions_;
  prometheus::Histogram* control_to_receiver_;
  prometheus::Histogram* control_to_sender_;
};

}  // namespace tandem
