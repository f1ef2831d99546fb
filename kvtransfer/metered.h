#pragma once

// Transfer metrics for any transport: CreateSender / CreateReceiver wrap the transport in these
// decorators when the options carry TransferHooks, so every implementation reports the same
// way. Per request: TransferStarted when the sender Begins (the receiver Expects), then exactly
// one TransferSucceeded (duration, bytes, blocks) or TransferFailed (reason from the status).

#include <memory>

#include "kvtransfer/transfer_hooks.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// The failure reason a transfer status maps to: DEADLINE_EXCEEDED timeout, ABORTED / CANCELLED
// aborted, UNAVAILABLE connection, DATA_LOSS checksum, FAILED_PRECONDITION incompatible (layout
// or a restarted receiver), anything else other.
TransferFailure TransferFailureOf(const absl::Status& status);
// Tells `hooks` (may be null) of a connection refused at its handshake when `status` says so
// (FAILED_PRECONDITION: incompatible, UNAUTHENTICATED); other failures are not refusals.
void ReportRefused(TransferHooks* hooks, TransferDirection direction, const absl::Status& status);

// `inner` does the work; `hooks` must outlive the sender.
std::unique_ptr<KvSender> MeterSender(std::unique_ptr<KvSender> inner, const KvLayout& layout,
                                      TransferHooks* hooks);

// Receivers take their completion callback at creation, so metering one is a factory: it
// wraps `on_complete`, calls `create` with the wrapped callback and meters the result.
using ReceiverFactory = std::function<absl::StatusOr<std::unique_ptr<KvReceiver>>(
    KvReceiver::CompletionCallback on_complete)>;
absl::StatusOr<std::unique_ptr<KvReceiver>> CreateMeteredReceiver(
    const ReceiverFactory& create, const KvLayout& layout, TransferHooks* hooks,
    KvReceiver::CompletionCallback on_complete);

}  // namespace tandem::kvtransfer
