#pragma once

// Weight-only quantization formats shared by the model loader and the compute kernels.
//
// kInt8: symmetric, one f32 scale per output channel (row): w[n, k] = q[n, k] * scale[n],
//   q int8 in [-127, 127], stored row-major [N, K].
// kInt4: asymmetric, group-wise along K: w[n, k] = (q[n, k] - zero[n, g]) * scale[n, g] with
//   g = k / group_size (group_size a power of two >= 32), q integers in [0, 15], zero integers in
//   [0, 16] (16 only from GPTQ v1 checkpoints, which store zero - 1 in a nibble); scales and zeros
//   f32 [N, G] (zeros hold the exact integers), G = ceil(K / group_size). Made at load time
//   (common/engine/model/quantize.h) or converted from AWQ / GPTQ checkpoints
//   (common/engine/model/int4_checkpoint.h). Each row is
//   Int4RowBytes(K) bytes: K padded to a multiple of 32 with q = 0, and every chunk of 32 elements
//   is 16 bytes where byte j holds element j in its low nibble and element j + 16 in its high
//   nibble (so 16 consecutive elements are one load + one shift whatever the vector width).
// In both formats the dequantized value is computed as one f32 product of exact operands
// ((q - zero) is an exact small integer), so every kernel and the reference agree bit for bit.

#include <cstdint>
#include <string_view>

namespace tandem {

enum class WeightQuant : uint8_t { kNone = 0, kInt8 = 1, kInt4 = 2 };

inline std::string_view WeightQuantName(WeightQuant q) {
  switch (q) {
    case WeightQuant::kNone:
      return "none";
    case WeightQuant::kInt8:
      return "int8";
    case WeightQuant::kInt4:
      return "int4";
  }
  return "?";
}

inline constexpr int64_t kInt4Chunk = 32;

inline int64_t Int4RowBytes(int64_t k) { return (k + kInt4Chunk - 1) / kInt4Chunk * 16; }

inline int64_t Int4Groups(int64_t k, int64_t group_size) {
  return (k + group_size - 1) / group_size;
}

}  // namespace tandem
