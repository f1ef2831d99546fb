#include "common/cluster/proto/cluster_proto.h"

#include <string>

namespace tandem {

v1::KvLayoutInfo KvLayoutToInfo(const KvLayout& layout) {
  v1::KvLayoutInfo info;
  info.set_model_id(layout.model_id);
  info.set_num_layers(layout.num_layers);
  info.set_num_kv_heads(layout.num_kv_heads);
  info.set_head_dim(layout.head_dim);
  info.set_block_size(layout.block_size);
  info.set_kv_dtype(std::string(DTypeName(layout.kv_dtype)));
  info.set_protocol_version(layout.protocol_version);
  return info;
}

absl::StatusOr<KvLayout> KvLayoutFromInfo(const v1::KvLayoutInfo& info) {
  absl::StatusOr<DType> kv_dtype = ParseKvDType(info.kv_dtype());
  if (!kv_dtype.ok()) return kv_dtype.status();
  KvLayout layout;
  layout.model_id = info.model_id();
  layout.num_layers = info.num_layers();
  layout.num_kv_heads = info.num_kv_heads();
  layout.head_dim = info.head_dim();
  layout.block_size = info.block_size();
  layout.kv_dtype = *kv_dtype;
  layout.protocol_version = info.protocol_version();
  return layout;
}

KvTransportPeer KvTransportPeerFromInfo(const std::string& address, const v1::WorkerInfo& info) {
  return {info.role(), address, info.kv_transport(), info.kv_device()};
}

}  // namespace tandem
