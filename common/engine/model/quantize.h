#pragma once

// Weight-only quantization made at load time (formats in common/base/quant.h). Each row is
// quantized on its own with plain scalar arithmetic, so the result depends only on the weights
// (not on threads or the machine's vector width).

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/quant.h"
#include "common/base/thread_pool.h"

namespace tandem {

// Codes and scales of one quantized [N, K] matrix, in the kernels' layout.
struct QuantizedMatrix {
  WeightQuant quant = WeightQuant::kNone;
  WeightLayout layout = WeightLayout::kRows;
  int64_t rows = 0, cols = 0, group_size = 0;
  // kRows: int8 [N, K] (int8 bit patterns), fp8 [N, K] (e4m3 codes), int4 [N, Int4RowBytes(K)];
  // kTiles16: quant.h (int4: with the scales and zeros)
  std::vector<uint8_t> codes;
  // int8: [QuantStoredRows(N)]; fp8: [N]; int4 kRows: [N, G] (kTiles16: empty, they are in `codes`)
  std::vector<float> scales;
  std::vector<float> zeros;  // int4 kRows: [N, G] (integers in [0, 16]); kTiles16: empty
};

// A quantized matrix in WeightLayout::kRows rearranged into kTiles16 (quant.h): the same codes,
// scales and zeros, padded to whole tiles of 16 rows. No-op when already there, and for fp8
// (which has no tiles).
void ToTiles16(QuantizedMatrix* m);

// Dense bf16 rows [N, K] (row-major) into kTiles16 (quant.h) at `tiles`, which holds
// QuantStoredRows(N, kTiles16) / 16 * Bf16TileBytes(K) bytes; the padding is +0. Tiles are
// written in parallel on `pool` (nullptr: the calling thread).
void Bf16ToTiles16(const uint16_t* rows, int64_t N, int64_t K, uint16_t* tiles, ThreadPool* pool);

// Quantizes row-major f32 rows `w` [N, K]. int8: symmetric per row, scale = max|w| / 127 (1 for
// an all-zero row), q = clamp(rint(w / scale), -127, 127). int4: per group of `group_size` (a
// power of two >= 32) along K, the range [min(w, 0), max(w, 0)] over 16 levels: scale =
// (hi - lo) / 15 (1 if 0), zero = clamp(rint(-lo / scale), 0, 15), q = clamp(rint(w / scale) +
// zero, 0, 15). fp8: per row, scale = max|w| / 448 (1 for an all-zero row), q = the e4m3 code
// of w / scale (quant.h Fp8E4M3Code: nearest even, saturating). `row_source(n, buf)` writes row n
// as f32 into buf[K] (so callers can convert rows from any stored dtype without materializing the
// whole f32 matrix).
template <class RowSource>
QuantizedMatrix Quantize(WeightQuant quant, int64_t N, int64_t K, int64_t group_size,
                         RowSource&& row_source, ThreadPool* pool);

// Quantizes one f32 row into `codes` (K or Int4RowBytes(K) bytes), `scales`, `zeros`.
void QuantizeRow(WeightQuant quant, const float* w, int64_t K, int64_t group_size, uint8_t* codes,
                 float* scales, float* zeros);

// The f32 values the kernels multiply with: row n of the dequantized matrix (K floats).
void DequantizeRow(WeightQuant quant, const uint8_t* codes, const float* scales, const float* zeros,
                   int64_t K, int64_t group_size, float* out);

// Parses "none", "int8", "int4", "fp8" (case-sensitive); false for anything else.
bool ParseWeightQuant(const std::string& text, WeightQuant* out);

template <class RowSource>
QuantizedMatrix Quantize(WeightQuant quant, int64_t N, int64_t K, int64_t group_size,
                         RowSource&& row_source, ThreadPool* pool) {
  QuantizedMatrix m;
  m.quant = quant;
  m.rows = N;
  m.cols = K;
  m.group_size = quant == WeightQuant::kInt4 ? group_size : 0;
  const int64_t row_bytes = quant == WeightQuant::kInt4 ? Int4RowBytes(K) : K;
  const int64_t groups = quant == WeightQuant::kInt4 ? Int4Groups(K, group_size) : 1;
  m.codes.assign(static_cast<size_t>(N * row_bytes), 0);
  m.scales.assign(static_cast<size_t>(N * groups), 0.0f);
  if (quant == WeightQuant::kInt4) m.zeros.assign(static_cast<size_t>(N * groups), 0.0f);
  auto work = [&](int64_t n0, int64_t n1) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = n0; n < n1; ++n) {
      row_source(n, row.data());
      QuantizeRow(quant, row.data(), K, group_size, m.codes.data() + n * row_bytes,
                  m.scales.data() + n * groups,
                  quant == WeightQuant::kInt4 ? m.zeros.data() + n * groups : nullptr);
    }
  };
  if (pool != nullptr && pool->size() > 1 && N * K > (1 << 16)) {
    pool->ParallelForGrain(N, 16, work);
  } else {
    work(0, N);
  }
  return m;
}

}  // namespace tandem
