#pragma once

#include <cstdint>

namespace tandem {

// Which side of a KV transfer this process is: the prefill worker sends, the decode worker
// receives. The `direction` label.
enum class TransferDirection { kSend = 0, kReceive = 1 };

// Why a transfer failed, the `reason` label. Bounded.
enum class TransferFailure {
  kTimeout = 0,      // deadline or lease expired
  kAborted,          // the request was cancelled or the peer aborted
  kConnection,       // the connection broke or could not be made
  kChecksum,         // data arrived corrupted
  kIncompatible,     // layout handshake refused (model, dtype, block size, ...)
  kUnauthenticated,  // shared-secret handshake failed (either side lacks or has another secret)
  kOther,
};
inline constexpr int kNumTransferFailures = 7;
inline const char* TransferFailureName(TransferFailure failure) {
  constexpr const char* kNames[kNumTransferFailures] = {
      "timeout", "aborted", "connection", "checksum", "incompatible", "unauthenticated", "other"};
  return kNames[static_cast<int>(failure)];
}

// What a KV transfer endpoint reports (implemented by TransferMetrics). Header-only interface:
// kvtransfer calls it without linking the metrics library. Thread-safe.
class TransferHooks {
 public:
  virtual ~TransferHooks() = default;
  // Every started transfer ends in exactly one TransferSucceeded or TransferFailed.
  virtual void TransferStarted(TransferDirection direction) = 0;
  virtual void TransferSucceeded(TransferDirection direction, double seconds, int64_t bytes,
                                 int64_t blocks) = 0;
  virtual void TransferFailed(TransferDirection direction, TransferFailure reason) = 0;
  // A connection refused at its handshake, by the side that refused it (tcp): kIncompatible
  // (layout or protocol mismatch) or kUnauthenticated (shared-secret authentication failed).
  // Not a transfer: no TransferStarted precedes it.
  virtual void ConnectionRefused(TransferDirection direction, TransferFailure reason) {}
};

}  // namespace tandem
