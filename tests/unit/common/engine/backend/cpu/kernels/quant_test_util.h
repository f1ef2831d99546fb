#pragma once

// Quantized weights for the CPU kernel tests: random f32 weights quantized as the model loader
// does (common/engine/model/quantize.h), with the dequantized matrix the kernels must use.

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/model/quantize.h"
#include "tests/unit/common/engine/backend/cpu/kernels/kernel_test_util.h"

namespace tandem::cpu::testing {

struct QWeights {
  QuantizedMatrix q;
  QuantizedMatrix tiles;       // q in WeightLayout::kTiles16 (what int8 inputs take)
  std::vector<float> dequant;  // [N, K] the values the kernel must use
  MatMulWeight view(DType input = DType::kF32) const {
    const QuantizedMatrix& m = input == DType::kI8 ? tiles : q;
    MatMulWeight w;
    w.input_dtype = input;
    w.data = m.codes.data();
    w.quant = m.quant;
    w.layout = m.layout;
    w.scales = m.scales.data();
    w.zeros = m.zeros.empty() ? nullptr : m.zeros.data();
    w.group_size = q.group_size;
    return w;
  }
};

inline QWeights MakeQuantized(WeightQuant quant, int64_t N, int64_t K, int64_t group,
                              uint64_t seed) {
  const std::vector<float> f = RandomFloats(N * K, seed, -0.7f, 1.3f);
  QWeights w;
  w.q = Quantize(
      quant, N, K, group,
      [&](int64_t n, float* row) { std::memcpy(row, f.data() + n * K, K * sizeof(float)); },
      nullptr);
  const int64_t groups = quant == WeightQuant::kInt4 ? Int4Groups(K, group) : 1;
  const int64_t row_bytes = quant == WeightQuant::kInt4 ? Int4RowBytes(K) : K;
  w.dequant.resize(N * K);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeRow(quant, w.q.codes.data() + n * row_bytes, w.q.scales.data() + n * groups,
                  w.q.zeros.empty() ? nullptr : w.q.zeros.data() + n * groups, K, group,
                  w.dequant.data() + n * K);
  }
  w.tiles = w.q;
  ToTiles16(&w.tiles);
  return w;
}

}  // namespace tandem::cpu::testing
