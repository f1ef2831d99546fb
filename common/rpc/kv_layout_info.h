#pragma once

#include "absl/status/statusor.h"
#include "common/base/kv_transfer_layout.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// The KV layout a worker advertises in WorkerInfo (v1::KvLayoutInfo) and the one layout type
// (common/base/kv_transfer_layout.h), both ways: workers write it, the router reads it and runs
// the transports' own check (CheckKvLayoutCompatible), so registration refuses exactly the
// workers the KV handshake would refuse, in the same words.
v1::KvLayoutInfo KvLayoutToInfo(const KvLayout& layout);

// INVALID_ARGUMENT for a KV dtype name this build does not know.
absl::StatusOr<KvLayout> KvLayoutFromInfo(const v1::KvLayoutInfo& info);

}  // namespace tandem
