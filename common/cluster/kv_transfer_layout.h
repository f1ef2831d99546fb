#pragma once

// The KV layout two processes must share to exchange KV-cache blocks: what the KV transport's
// handshake compares (kvtransfer) and what the router compares when it registers a worker, with
// one compatibility check so both refuse the same pairs with the same words. A worker builds it
// from its engine's KV pool (common/worker/backend_regions.h, LayoutOf); the router gets it from
// the worker's v1::KvLayoutInfo (common/cluster/proto/cluster_proto.h, which also writes it).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/base/kv_layout.h"

namespace tandem {

// The KV transfer protocol (kvtransfer's wire format). 2: the shared-secret challenge-response
// (CHALLENGE, AUTH, WELCOME's proof). 3: BEGIN proves the transfer's key; with a secret the
// layout is checked only after the challenge.
inline constexpr uint32_t kKvTransferProtocolVersion = 3;

struct KvLayout {
  std::string model_id;
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  DType kv_dtype = DType::kF32;
  uint32_t protocol_version = kKvTransferProtocolVersion;

  // Bytes of one (layer, block) region: [2][num_kv_heads][block_size][head_dim] of kv_dtype (plus
  // per-row scales for int8 / fp8, common/base/kv_layout.h).
  size_t region_bytes() const {
    return KvRegionBytes(num_kv_heads, block_size, head_dim, kv_dtype);
  }
};

// OK when `peer` can exchange KV with `local`; else FAILED_PRECONDITION naming the first field
// that differs (protocol version, model id, layers, KV heads, head dim, block size, KV dtype),
// with both values: "kv layout mismatch in num_kv_heads: local 8, peer 4".
absl::Status CheckKvLayoutCompatible(const KvLayout& local, const KvLayout& peer);

// INVALID_ARGUMENT unless every dimension is positive and the dtype is a KV dtype.
absl::Status ValidateKvLayout(const KvLayout& layout);

std::string KvLayoutDebugString(const KvLayout& layout);

// The KV dtype that DTypeName names ("f32", "bf16", "i8", "f8e4m3"), as a layout travels in
// v1::KvLayoutInfo; INVALID_ARGUMENT for any other name.
absl::StatusOr<DType> ParseKvDType(std::string_view name);

}  // namespace tandem
