#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// Which side of a KV transfer this process is: the prefill worker sends, the decode worker
// receives. The `direction` label.
enum class TransferDirection { kSend = 0, kReceive = 1 };

// Why a transfer failed, the `reason` label. Bounded.
enum class TransferFailure {
  kTimeout = 0,   // deadline or lease expired
  kAborted,       // the request was cancelled or the peer aborted
  kConnection,    // the connection broke or could not be made
  kChecksum,      // data arrived corrupted
  kIncompatible,  // layout handshake refused (model, dtype, block size, ...)
  kOther,
};
inline constexpr int kNumTransferFailures = 6;
const char* TransferFailureName(TransferFailure failure);

// Metric families of kvtransfer (DESIGN §5) for one transport (tcp, nccl, loopback), labelled
// by transport and direction. Thread-safe.
//
//   tandem_kv_transfer_duration_seconds{transport, direction}   one request's KV, start to done
//   tandem_kv_transfer_size_bytes{transport, direction}         bytes moved per request
//   tandem_kv_transfer_blocks_total{transport, direction}       KV blocks moved
//   tandem_kv_transfers_in_flight{transport, direction}
//   tandem_kv_transfer_failures_total{transport, direction, reason}
class TransferMetrics {
 public:
  TransferMetrics(prometheus::Registry* registry, std::string_view transport);
  TransferMetrics(const TransferMetrics&) = delete;
  TransferMetrics& operator=(const TransferMetrics&) = delete;

  void TransferStarted(TransferDirection direction);
  void TransferSucceeded(TransferDirection direction, double seconds, int64_t bytes,
                         int64_t blocks);
  void TransferFailed(TransferDirection direction, TransferFailure reason);

 private:
  struct PerDirection {
    prometheus::Histogram* seconds;
    prometheus::Histogram* bytes;
    prometheus::Counter* blocks;
    prometheus::Gauge* in_flight;
    std::array<prometheus::Counter*, kNumTransferFailures> failures;
  };
  std::array<PerDirection, 2> directions_;
};

}  // namespace tandem
