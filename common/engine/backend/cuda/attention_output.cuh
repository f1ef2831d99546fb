#pragma once

// Where a row's attention result goes, for every attention path (the tile kernel,
// decode_attention.cuh, mma_attention.cuh): element d of head h of the item's query token `tl` to
// `out` (o / l), or, for an item that is one split of a key range, to its partial slot with the
// row's (m, l) for MergeSplitsKernel.

#include <cstdint>

#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda {

template <class OT>
TANDEM_DEVICE void StoreAttentionValue(const AttentionArgs& a, const AttentionItem& it, int tl,
                                       int h, int d, float value, float m, float l) {
  const int64_t hd = a.kv.head_dim;
  if (it.partial < 0) {
    OT* out = static_cast<OT*>(a.out);
    dev::Store(out + static_cast<int64_t>(it.token_begin + tl) * a.ldo + h * hd + d, value);
    return;
  }
  const int64_t cell =
      (static_cast<int64_t>(it.partial + tl) * kMaxAttentionSplits + it.split) * a.num_heads + h;
  a.partial_out[cell * hd + d] = value;
  if (d == 0) {
    a.partial_ml[cell * 2] = m;
    a.partial_ml[cell * 2 + 1] = l;
  }
}

}  // namespace tandem::cuda
