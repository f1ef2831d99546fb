#include "common/cluster/kv_transfer_layout.h"

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

template <typename T>
absl::Status Mismatch(const char* field, const T& local, const T& peer) {
  return absl::FailedPreconditionError(
      absl::StrCat("kv layout mismatch in ", field, ": local ", local, ", peer ", peer));
}

}  // namespace

absl::Status CheckKvLayoutCompatible(const KvLayout& local, const KvLayout& peer) {
  // The protocol version first: with a different protocol the other fields may mean other things.
  if (local.protocol_version != peer.protocol_version) {
    return Mismatch("protocol_version", local.protocol_version, peer.protocol_version);
  }
  if (local.model_id != peer.model_id) {
    return Mismatch("model_id", absl::StrCat("'", local.model_id, "'"),
                    absl::StrCat("'", peer.model_id, "'"));
  }
  if (local.num_layers != peer.num_layers) {
    return Mismatch("num_layers", local.num_layers, peer.num_layers);
  }
  if (local.num_kv_heads != peer.num_kv_heads) {
    return Mismatch("num_kv_heads", local.num_kv_heads, peer.num_kv_heads);
  }
  if (local.head_dim != peer.head_dim) return Mismatch("head_dim", local.head_dim, peer.head_dim);
  if (local.block_size != peer.block_size) {
    return Mismatch("block_size", local.block_size, peer.block_size);
  }
  if (local.kv_dtype != peer.kv_dtype) {
    return Mismatch("kv_dtype", std::string(DTypeName(local.kv_dtype)),
                    std::string(DTypeName(peer.kv_dtype)));
  }
  return absl::OkStatus();
}

absl::Status ValidateKvLayout(const KvLayout& l) {
  if (l.num_layers <= 0 || l.num_kv_heads <= 0 || l.head_dim <= 0 || l.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv layout needs positive dimensions: ", KvLayoutDebugString(l)));
  }
  if (!IsKvDType(l.kv_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv layout: ", std::string(DTypeName(l.kv_dtype)), " is not a KV dtype"));
  }
  return absl::OkStatus();
}

std::string KvLayoutDebugString(const KvLayout& l) {
  return absl::StrCat(
      "model_id='", l.model_id, "' num_layers=", l.num_layers, " num_kv_heads=", l.num_kv_heads,
      " head_dim=", l.head_dim, " block_size=", l.block_size,
      " kv_dtype=", std::string(DTypeName(l.kv_dtype)), " protocol_version=", l.protocol_version);
}

absl::StatusOr<DType> ParseKvDType(std::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    if (DTypeName(t) == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", std::string(name), "' is not a KV dtype"));
}

}  // namespace tandem
