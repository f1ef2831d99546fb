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

// Why a receiver refused or closed a connection for one of its limits, or refused a transfer's
// message because its sender was not the one named for the transfer (kvtransfer/README.md,
// "Bounds"): further `reason` values of the connections-refused counter. Bounded.
enum class KvRefusal {
  kConnectionLimit = 0,  // open connections at their cap
  kPeerConnectionLimit,  // open connections from the peer's address at their cap
  kHandshakeTimeout,     // the whole handshake took longer than its deadline
  kMemory,               // the connection's buffers did not fit the receiver's memory budget
  kNotNamed,             // BEGIN without the transfer's key, or another sender's attempt
};
inline constexpr int kNumKvRefusals = 5;
inline const char* KvRefusalName(KvRefusal refusal) {
  constexpr const char* kNames[kNumKvRefusals] = {"connection_limit", "peer_connection_limit",
                                                  "handshake_timeout", "memory", "not_named"};
  return kNames[static_cast<int>(refusal)];
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
  // A connection refused or closed for a limit, or a message refused (KvRefusal).
  virtual void Refused(TransferDirection direction, KvRefusal reason) {}
  // Transports with control messages (nccl, cuda-ipc), once per attempt that sent FINISH or
  // ABORT, by the sender once that last one was answered: the control messages of the attempt
  // it sent to the receiver (BEGIN, FINISH, ABORT, ...) and the replies it received.
  virtual void ControlMessages(int64_t to_receiver, int64_t to_sender) {}
};

}  // namespace tandem
