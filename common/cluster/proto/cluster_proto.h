#pragma once

// The cluster protocol's pieces (common/cluster) as the worker API carries them, so that every
// process reads and writes them the same way.

#include <string>

#include "absl/status/statusor.h"
#include "common/cluster/kv_transfer_layout.h"
#include "common/cluster/kv_transport_pair.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// The KV layout a worker advertises in WorkerInfo (v1::KvLayoutInfo) and the one layout type
// (common/cluster/kv_transfer_layout.h), both ways: workers write it, the router reads it and runs
// the transports' own check (CheckKvLayoutCompatible), so registration refuses exactly the
// workers the KV handshake would refuse, in the same words.
v1::KvLayoutInfo KvLayoutToInfo(const KvLayout& layout);

// INVALID_ARGUMENT for a KV dtype name this build does not know.
absl::StatusOr<KvLayout> KvLayoutFromInfo(const v1::KvLayoutInfo& info);

// A worker's side of a KV transport pair (PairKvTransport) from what it advertises: its role,
// WorkerInfo.kv_transport and kv_device; `address` names it in messages.
KvTransportPeer KvTransportPeerFromInfo(const std::string& address, const v1::WorkerInfo& info);

}  // namespace tandem
