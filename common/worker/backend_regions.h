#pragma once

#include "common/engine/backend/backend.h"
#include "kvtransfer/transport.h"

namespace tandem {

// Gives the KV transport access to a backend's pool regions: host addresses on the CPU backend,
// device addresses (for nccl) with `device_memory` on the CUDA backend. Both are plain address
// arithmetic, so transport threads may call them concurrently with the engine thread; the
// blocks involved are held (sender) or reserved (receiver) for the transfer.
class BackendRegions : public kvtransfer::KvRegionAccess {
 public:
  explicit BackendRegions(Backend* backend, bool device_memory = false)
      : backend_(backend), device_memory_(device_memory) {}
  uint8_t* Region(int64_t layer, int32_t block) override;  // backend_regions.cc
  int64_t num_blocks() const override { return backend_->kv_spec().num_blocks; }
  void* LayerReadyEvent(int64_t layer) override;  // the CUDA backend's event; else none

 private:
  Backend* backend_;
  bool device_memory_;
};

// The transfer handshake descriptor of an engine's KV pool.
inline kvtransfer::KvLayout LayoutOf(const Backend& backend, const std::string& model_id) {
  const KvCacheSpec& s = backend.kv_spec();
  kvtransfer::KvLayout l;
  l.model_id = model_id;
  l.num_layers = s.num_layers;
  l.num_kv_heads = s.num_kv_heads;
  l.head_dim = s.head_dim;
  l.block_size = s.block_size;
  l.kv_dtype = s.dtype;
  return l;
}

}  // namespace tandem
