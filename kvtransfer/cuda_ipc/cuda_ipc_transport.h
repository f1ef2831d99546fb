#pragma once

// The cuda-ipc transport (README.md, "CUDA IPC transport"): a prefill and a decode worker in two
// processes on the same GPU. The receiver exports its KV pool allocation once
// (cudaIpcGetMemHandle); the handle, with the pool's layout and the receiver's GPU id and
// incarnation, travels in the WELCOME of a CONNECT over the caller's ControlChannel (the
// KvControl gRPC service: TLS and the KV secret's proofs as for nccl), after the same layout
// check as tcp and a check that both sides are on one GPU. The sender maps the pool
// (cudaIpcOpenMemHandle, once per receiver incarnation; closed when that incarnation's peer is
// replaced) and copies the reserved regions device to device on its own stream, layer by
// layer; each copy is admitted by the receiver first and reported landed after, so the
// receiver still decides what may be written and Cancel waits for a copy in flight.
// Requires a build with CUDA (or the test-only GPU emulation).

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::cuda_ipc {

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete);

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access);

// Random per process: a sender refuses to map a pool of its own process.
uint64_t ProcessToken();

}  // namespace tandem::kvtransfer::cuda_ipc
