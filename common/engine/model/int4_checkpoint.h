#pragma once

// Conversion of one AWQ (GEMM) or GPTQ int4 projection, as stored in its checkpoint, into the
// kernels' int4 group format (common/base/quant.h). Stored layouts (out = N, in = K, G = K /
// group):
//
// AWQ GEMM: qweight I32 [K, N/8]: int32 qweight[k, c] holds w[8c + kAwqOrder[i], k] in bits
//   4i..4i+3 (kAwqOrder = 0, 2, 4, 6, 1, 3, 5, 7); qzeros I32 [G, N/8], packed the same way;
//   scales F16/BF16 [G, N]. w = (q - zero) * scale.
// GPTQ: qweight I32 [K/8, N]: int32 qweight[r, n] holds w[n, 8r + i] in bits 4i..4i+3;
//   qzeros I32 [G, N/8]: int32 qzeros[g, c] holds the zero of output 8c + i in bits 4i..4i+3,
//   stored as zero - 1 in checkpoint_format "gptq" (v1; a stored 15 means zero 16) and as is in
//   "gptq_v2"; scales F16/BF16 [G, N]; g_idx I32 [K] (optional): the group of each input
//   channel. w = (q - zero[g_idx[k]]) * scale[g_idx[k]].
//
// Act-order (g_idx other than k / group): the input channels are permuted (stable sort by g_idx)
// so that every group is contiguous again; the matrix then multiplies x[perm[j]] in column j
// (Tensor::input_perm). Each group must hold exactly `group` channels.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/engine/model/checkpoint.h"
#include "common/engine/model/quant_config.h"
#include "common/engine/model/quantize.h"

namespace tandem {

inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// The stored tensors of one projection `<prefix>.{qweight,qzeros,scales,g_idx}`; g_idx's entry
// may be null (absent).
struct PackedInt4Refs {
  Checkpoint::TensorRef qweight, qzeros, scales, g_idx;
};

struct Int4CheckpointMatrix {
  QuantizedMatrix matrix;     // int4, [N, K] in the kernels' layout
  std::vector<int32_t> perm;  // act-order input permutation [K]; empty when the identity
};

// Validates the tensors against `config` and the projection's [N, K] (dtypes, shapes, group
// size dividing K, N a multiple of 8, g_idx values, finite scales, GPTQ sym zeros equal to 8) and
// converts them. Errors name the file and tensor. Group size -1 (GPTQ) becomes one group per row
// (group_size: the next power of two >= max(K, 32)).
absl::StatusOr<Int4CheckpointMatrix> ConvertInt4Checkpoint(const CheckpointQuantConfig& config,
                                                           const PackedInt4Refs& refs, int64_t N,
                                                           int64_t K, ThreadPool* pool);

}  // namespace tandem
