#pragma once

// The in-process transport for tests: a process-wide registry maps endpoint names to
// receivers; a sender's one worker thread copies regions with memcpy. It runs the same checks
// as tcp (layout handshake, incarnation, block ids, checksum, FINISH completeness, deadlines,
// fault injection), so tests of the callers behave as they would over the network.

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::loopback {

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete);

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access);

}  // namespace tandem::kvtransfer::loopback
