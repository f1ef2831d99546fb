#pragma once

// The NCCL transport (DESIGN §5): KV regions in device memory move GPU to GPU over a two-rank
// NCCL communicator per (sender, receiver) pair, created lazily: the sender draws an
// ncclUniqueId and hands it to the receiver in a CONNECT control message over the caller's
// ControlChannel (the gRPC control channel between the workers), together with its KvLayout;
// the receiver refuses a mismatch naming the field (as tcp does) or joins. Pools on both sides
// are bounded by max_communicators (least recently used idle communicators are destroyed).
// BEGIN, FINISH and ABORT also travel on the control channel, so Begin fails fast on an
// unknown transfer; DATA messages (a 4 KiB header, then the regions) travel over NCCL.
// Every device wait has a deadline; a communicator that misses one is aborted.
// Checksums: none on the payload (NVLink / InfiniBand links are CRC-protected); the header
// carries a CRC32C. Fault injection applies to tcp and loopback only.

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::nccl {

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete);

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access);

// OK when CUDA device `device` is usable (communicator.cc).
absl::Status CheckDevice(int device);

}  // namespace tandem::kvtransfer::nccl
