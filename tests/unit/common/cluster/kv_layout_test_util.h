#pragma once

// A small KV layout for tests of the layout check, the transports and the router.

#include "common/cluster/kv_transfer_layout.h"

namespace tandem::testing {

inline KvLayout SmallKvLayout() {
  KvLayout l;
  l.model_id = "test-model";
  l.num_layers = 4;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.block_size = 4;
  l.kv_dtype = DType::kBF16;  // region = 2*2*4*8*2 = 256 bytes
  return l;
}

}  // namespace tandem::testing
