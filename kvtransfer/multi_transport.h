#pragma once

// A worker that speaks several device transports at once ("nccl,cuda-ipc": `--kv-transport
// auto` on a GPU), so that each pair of workers uses the one that fits it: cuda-ipc with a peer
// on its own GPU, nccl with one on another (common/cluster/kv_transport_pair.h; the router names
// the transport of each transfer in its target).
//
// MultiSender: one sender per transport, sharing the control channel; Begin runs the transfer on
// the sender its target's `transport` names; the other calls follow the handle.
// MultiReceiver: one receiver per transport, all with the same endpoint (the worker's KvControl
// service) and one incarnation. Every expectation is registered with each (the sender may come
// over either, and a retry over another); the first attempt that completes OK cancels it in the
// others, and only outcomes of expectations still open reach `on_complete`. Control messages go
// to the transport whose request kinds they carry (control_message.h).
//
// Only transports with a control channel combine (nccl, cuda-ipc): they share one endpoint.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// Whether `transport` lists several transports ("a,b").
bool IsMultiTransport(const std::string& transport);

// `options.transport` lists the transports; every other option applies to each. Metrics: the
// sender's per transport (SenderOptions::transport_hooks); the receiver is metered as a whole
// by CreateReceiver (a transfer's transport is known only once it begins).
absl::StatusOr<std::unique_ptr<KvSender>> CreateMultiSender(const SenderOptions& options,
                                                            KvRegionAccess* access);
absl::StatusOr<std::unique_ptr<KvReceiver>> CreateMultiReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete);

}  // namespace tandem::kvtransfer
