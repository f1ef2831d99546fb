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
// kFp8: fp8 e4m3 ("E4M3FN": bias 7, no infinities, 0x7f / 0xff NaN, max 448), one f32 scale per
//   output channel (row): w[n, k] = e4m3(q[n, k]) * scale[n], stored row-major [N, K] (kRows only).
//   Made at load time from dense checkpoints (scale = max|w| / 448, codes of w / scale rounded to
//   nearest even, saturating at 448) or read from fp8 checkpoints as published
//   (compressed-tensors "float-quantized", fbgemm_fp8; common/engine/model/fp8_checkpoint.h).
//   The kernels widen a code to its value times 2^-8 (exact: the bits placed in an f16, as the
//   fp8 KV cache does) and multiply by 256 * scale[n] (exact), the same f32 product as
//   e4m3(q) * scale[n].
// In all formats the dequantized value is computed as one f32 product of exact operands
// ((q - zero) is an exact small integer), so every kernel and the reference agree bit for bit.
//
// Layouts (WeightLayout). The above is kRows. kTiles16 (what the CPU kernels with int8 MatMul
// inputs take; made from kRows at load by common/engine/model/quantize.h ToTiles16) holds the
// same values with 16 rows side by side, so that one 64-byte vector is 16 rows x 4 elements, the
// u8 operand of vpdpbusd against 4 input bytes broadcast: rows in tiles of 16 (N padded to a
// multiple of 16 with code 0 and scale 0, zero 0), and
// - int8: tile t is 16 * Int8TileK(K) bytes (K padded to a multiple of 4), step p 64 bytes where
//   byte 4l + i holds row 16t + l's element 4p + i as q + 128 (u8); scales [N / 16 * 16];
// - int4: tile t is Int4TileBytes(K, group_size) bytes: per group g one block at
//   Int4TileGroupStart(g), its Int4TileGroupSteps steps (group_size / 8; fewer in a last group
//   cut short by K) of 64 bytes where byte 4l + i of step p holds row 16t + l's element
//   8p + i in its low nibble and element 8p + 4 + i in its high nibble (i < 4, p counted from
//   the row's start), then the group's 16 f32 scales and 16 f32 zeros (lane l = row 16t + l).
//   So one tile is one stream, read front to back once (scales and zeros in arrays of their own
//   would make three streams per tile, and a lone decode row is bound by its weight streams).
//   The codes, scales and zeros are all in the one buffer (no separate scale or zero arrays).
// Dense bf16 matrices come in kTiles16 too (what the CPU kernels with bf16 MatMul inputs on
// AVX512_BF16 take; made at load by common/engine/model/quantize.h Bf16ToTiles16): tile t is
// Bf16TileBytes(K) bytes (K padded to even), step p 64 bytes = 32 bf16 where element 2l + i
// holds row 16t + l's element 2p + i (Bf16TileIndex), the operand of vdpbf16ps against one input
// pair broadcast; padding (rows to whole tiles, the odd K's last element) is +0. One tile is one
// stream, where row-major rows would need eight streams per thread for eight outputs (and a
// horizontal sum per output).

#include <cstdint>
#include <string_view>

namespace tandem {

// The layout helpers below are called from kernel files built with ISA flags: always inlined,
// so that no out-of-line copy (an unoptimized build emits one for a plain inline function) made
// under those flags can be the one the linker keeps for every caller (kernels README, "ODR").
#define TANDEM_LAYOUT_FN inline __attribute__((always_inline))

enum class WeightQuant : uint8_t { kNone = 0, kInt8 = 1, kInt4 = 2, kFp8 = 3 };

// How a MatMul weight's elements (quantized: codes, scales and zeros) are laid out (above).
enum class WeightLayout : uint8_t { kRows = 0, kTiles16 = 1 };

inline constexpr int64_t kQuantTileRows = 16;

// Rows of a quantized matrix of N rows as stored in `layout` (kTiles16 pads to whole tiles).
TANDEM_LAYOUT_FN int64_t QuantStoredRows(int64_t n, WeightLayout layout) {
  return layout == WeightLayout::kTiles16
             ? (n + kQuantTileRows - 1) / kQuantTileRows * kQuantTileRows
             : n;
}

inline std::string_view WeightQuantName(WeightQuant q) {
  switch (q) {
    case WeightQuant::kNone:
      return "none";
    case WeightQuant::kInt8:
      return "int8";
    case WeightQuant::kInt4:
      return "int4";
    case WeightQuant::kFp8:
      return "fp8";
  }
  return "?";
}

// fp8 e4m3 code (round to nearest even, saturating at 448; NaN to 448) of x. The one conversion
// of the project's host code: the CPU KV cache (cpu/kernels/attention_impl.h) and the fp8 weights
// (common/engine/model/quantize.cc) both call it; the device copy is cuda/kv_codes.cuh's.
TANDEM_LAYOUT_FN uint8_t Fp8E4M3Code(float x) {
  const uint32_t b = __builtin_bit_cast(uint32_t, x);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80);
  const float a = __builtin_bit_cast(float, b & 0x7fffffffu);
  if (!(a < 464.0f)) return sign | 0x7e;          // saturate (and NaN) to 448
  if (a < 0.015625f) {                            // below the smallest normal: multiples of 2^-9
    const float q = __builtin_rintf(a * 512.0f);  // exact scaling, then round to even
    return sign | static_cast<uint8_t>(q);        // q == 8 is the smallest normal's code
  }
  int32_t e = static_cast<int32_t>((__builtin_bit_cast(uint32_t, a) >> 23) & 0xff) - 127;
  const uint32_t m = __builtin_bit_cast(uint32_t, a) & 0x7fffffu;
  uint32_t keep = m >> 20;
  const uint32_t rest = m & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u) != 0)) ++keep;
  if (keep == 8) {
    keep = 0;
    ++e;
  }
  if (e > 8 || (e == 8 && keep > 6)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(((e + 7) << 3) | static_cast<int32_t>(keep));
}

// The value of an fp8 e4m3 code times 2^-8 (exact; what the kernels' widening gives). NaN codes
// (0x7f, 0xff) read as 480 * 2^-8: the quantizers never write them.
TANDEM_LAYOUT_FN float Fp8E4M3ValueScaled(uint8_t c) {
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  const float v = e == 0 ? static_cast<float>(m) * 0x1p-17f
                         : __builtin_bit_cast(float, ((e + 112u) << 23) | (m << 20));
  return (c & 0x80) != 0 ? -v : v;
}

// The value of an fp8 e4m3 code (exact).
TANDEM_LAYOUT_FN float Fp8E4M3Value(uint8_t c) { return Fp8E4M3ValueScaled(c) * 256.0f; }

inline constexpr int64_t kInt4Chunk = 32;

TANDEM_LAYOUT_FN int64_t Int4RowBytes(int64_t k) { return (k + kInt4Chunk - 1) / kInt4Chunk * 16; }

// Code of element k of an int4 row in WeightLayout::kRows (chunk k / 32, byte k % 16, the high
// nibble for k % 32 >= 16).
TANDEM_LAYOUT_FN int Int4RowCode(const uint8_t* row, int64_t k) {
  const uint8_t b = row[k / kInt4Chunk * 16 + k % 16];
  return k % kInt4Chunk < 16 ? b & 15 : b >> 4;
}

// Elements per row of an int8 matrix in kTiles16 (K padded to whole steps of 4).
TANDEM_LAYOUT_FN int64_t Int8TileK(int64_t k) { return (k + 3) / 4 * 4; }

TANDEM_LAYOUT_FN int64_t Int4Groups(int64_t k, int64_t group_size) {
  return (k + group_size - 1) / group_size;
}

// kTiles16 int4 (above): bytes of one tile of 16 rows, where group g's block starts in it, and
// the steps of 8 elements in that block.
TANDEM_LAYOUT_FN int64_t Int4TileBytes(int64_t k, int64_t group_size) {
  return kQuantTileRows * Int4RowBytes(k) + 128 * Int4Groups(k, group_size);
}
TANDEM_LAYOUT_FN int64_t Int4TileGroupStart(int64_t g, int64_t group_size) {
  return g * (8 * group_size + 128);
}
TANDEM_LAYOUT_FN int64_t Int4TileGroupSteps(int64_t k, int64_t g, int64_t group_size) {
  const int64_t left = Int4RowBytes(k) / 4 - g * (group_size / 8);
  return left < group_size / 8 ? left : group_size / 8;
}
// Where group g's 16 f32 scales start in a tile (its 16 zeros follow, 64 bytes on).
TANDEM_LAYOUT_FN int64_t Int4TileGroupScales(int64_t k, int64_t g, int64_t group_size) {
  return Int4TileGroupStart(g, group_size) + 64 * Int4TileGroupSteps(k, g, group_size);
}

// kTiles16 dense bf16 (above): elements per row as stored (K padded to even), bytes of one tile
// of 16 rows, and where element k of row n is, in bf16 elements from the start of the matrix.
TANDEM_LAYOUT_FN int64_t Bf16TileK(int64_t k) { return (k + 1) / 2 * 2; }
TANDEM_LAYOUT_FN int64_t Bf16TileBytes(int64_t k) { return kQuantTileRows * Bf16TileK(k) * 2; }
TANDEM_LAYOUT_FN int64_t Bf16TileIndex(int64_t k_total, int64_t n, int64_t k) {
  return n / kQuantTileRows * kQuantTileRows * Bf16TileK(k_total) + k / 2 * 32 +
         2 * (n % kQuantTileRows) + k % 2;
}

}  // namespace tandem
