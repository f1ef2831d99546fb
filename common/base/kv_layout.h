#pragma once

// Bytes of one (layer, block) region of a paged KV cache, shared by the backends' pools and the
// KV transport (so both sides agree on region sizes).
//
// Layout: codes [2 (K, V)][num_kv_heads][block_size][head_dim] of `dtype`; for the quantized KV
// dtypes (kI8, kF8E4M3) followed by one f32 scale per row, [2][num_kv_heads][block_size]: row
// value = code * scale (int8), or e4m3(code) * scale / 256 (fp8, the kernels' widening carries
// 2^-8), each (token, head) row quantized on its own from its max |value|.

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"

namespace tandem {

// True for the KV dtypes that carry a per-row scale.
inline bool KvDTypeIsQuantized(DType t) { return t == DType::kI8 || t == DType::kF8E4M3; }

// True for the KV cache dtypes the CPU backend supports.
inline bool IsKvDType(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || KvDTypeIsQuantized(t);
}

inline size_t KvRegionBytes(int64_t num_kv_heads, int64_t block_size, int64_t head_dim,
                            DType dtype) {
  const size_t rows = static_cast<size_t>(2 * num_kv_heads * block_size);
  return rows * static_cast<size_t>(head_dim) * DTypeSize(dtype) +
         (KvDTypeIsQuantized(dtype) ? rows * sizeof(float) : 0);
}

// Block ids from this one on name block (id - kKvRemoteBlock) of a second pool of the same region
// layout: a decode worker's pool mapped into a prefill worker for a zero-copy KV transfer
// (kvtransfer/README.md "Zero-copy on one GPU"; ForwardBatch::remote_kv). Never an id of the
// local pool (BlockPool hands out ids below its size, far below this).
inline constexpr int32_t kKvRemoteBlock = 1 << 30;

}  // namespace tandem
