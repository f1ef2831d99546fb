// Quantized MatMul (int8 per-row, int4 groups with zeros, fp8 e4m3 per-row): bit-exact against
// MatMul over the dequantized f32 matrix (the reference, scalar dequantization in
// common/engine/model), bit-exact batch invariance, and the quantization error bound, for every
// SIMD level this CPU supports.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/model/quantize.h"
#include "tests/unit/common/engine/backend/cpu/kernels/kernel_test_util.h"
#include "tests/unit/common/engine/backend/cpu/kernels/quant_test_util.h"

namespace tandem::cpu {
namespace {

using testing::MakeQuantized;
using testing::PerSimdLevelTest;
using testing::QWeights;
using testing::RandomFloats;

struct Format {
  WeightQuant quant;
  int64_t group;
};
const Format kFormats[] = {{WeightQuant::kInt8, 0},
                           {WeightQuant::kInt4, 32},
                           {WeightQuant::kInt4, 128},
                           {WeightQuant::kFp8, 0}};

class QuantMatMulTest : public PerSimdLevelTest {};

// The fused kernel equals the f32 kernel on the dequantized matrix, bit for bit, on shapes with
// K tails inside and across 32-element chunks and groups.
TEST_P(QuantMatMulTest, EqualsDenseMatMulOfDequantizedWeights) {
  ThreadPool pool(2);
  for (const Format& fmt : kFormats) {
    for (int64_t K : {1, 15, 16, 17, 31, 64, 100, 172, 257, 1000}) {
      for (int64_t N : {1, 5, 31, 40}) {
        const QWeights w = MakeQuantized(fmt.quant, N, K, fmt.group, 5 + K * 3 + N);
        for (int64_t M : {1, 2, 5, 9}) {
          const int64_t ldx = K + 3, ldy = N + 2;
          const auto x = RandomFloats(M * ldx, 7 + K + M);
          const auto bias = RandomFloats(N, 3 + N);
          std::vector<float> y(M * ldy, -7.0f), ref(M * ldy, -7.0f);
          MatMul(x.data(), M, K, ldx, w.view(), N, bias.data(), y.data(), ldy, &pool);
          MatMul(x.data(), M, K, ldx, w.dequant.data(), DType::kF32, N, bias.data(), ref.data(),
                 ldy, nullptr);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
              << WeightQuantName(fmt.quant) << " g=" << fmt.group << " K=" << K << " N=" << N
              << " M=" << M;
        }
      }
    }
  }
}

// bf16 inputs: int4 weights are used as bf16(dequantized value), int8 and fp8 weights as their
// codes' values (exact in bf16) with the row scale applied to the finished dot product, then the
// bias. So the result equals the bf16-input MatMul over that dense bf16 matrix (int8: without bias,
// then
// * scale + bias) bit for bit, across K tails, several dequantized blocks of rows (K = 1000: 131
// rows per block) and a split among threads.
TEST_P(QuantMatMulTest, Bf16InputsEqualDenseBf16OfDequantizedWeights) {
  ThreadPool pool(2);
  struct Shape {
    int64_t K, N, M;
  };
  for (const Format& fmt : kFormats) {
    // Per-row scale applied after the dot product.
    const bool int8 = fmt.quant == WeightQuant::kInt8 || fmt.quant == WeightQuant::kFp8;
    for (Shape s : {Shape{1, 5, 3}, Shape{31, 40, 9}, Shape{100, 31, 1}, Shape{257, 40, 17},
                    Shape{1000, 300, 37}, Shape{1000, 300, 1}}) {
      const QWeights w = MakeQuantized(fmt.quant, s.N, s.K, fmt.group, 61 + s.K + s.N);
      std::vector<float> values = w.dequant;
      if (fmt.quant == WeightQuant::kInt8) {
        const auto* codes = reinterpret_cast<const int8_t*>(w.q.codes.data());
        for (int64_t i = 0; i < s.N * s.K; ++i) values[i] = static_cast<float>(codes[i]);
      } else if (fmt.quant == WeightQuant::kFp8) {
        for (int64_t i = 0; i < s.N * s.K; ++i) values[i] = Fp8E4M3Value(w.q.codes[i]);
      }
      const std::vector<uint16_t> bf16 = testing::ToBf16(values);
      MatMulWeight dense;
      dense.data = bf16.data();
      dense.dtype = DType::kBF16;
      dense.input_dtype = DType::kBF16;
      const int64_t ldx = s.K + 3;
      const auto x = RandomFloats(s.M * ldx, 62 + s.K);
      const auto bias = RandomFloats(s.N, 63);
      std::vector<float> y(s.M * s.N), ref(s.M * s.N);
      MatMul(x.data(), s.M, s.K, ldx, w.view(DType::kBF16), s.N, bias.data(), y.data(), s.N, &pool);
      MatMul(x.data(), s.M, s.K, ldx, dense, s.N, int8 ? nullptr : bias.data(), ref.data(), s.N,
             nullptr);
      if (int8) {
        for (int64_t m = 0; m < s.M; ++m) {
          for (int64_t n = 0; n < s.N; ++n) {
            float v = ref[m * s.N + n] * w.q.scales[n];
            v += bias[n];
            ref[m * s.N + n] = v;
          }
        }
      }
      ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
          << WeightQuantName(fmt.quant) << " g=" << fmt.group << " K=" << s.K << " N=" << s.N
          << " M=" << s.M;
    }
  }
}

TEST_P(QuantMatMulTest, BatchInvariant) {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  for (const Format& fmt : kFormats) {
    for (DType input : {DType::kF32, DType::kBF16}) {
      const int64_t K = 300, N = 130;
      const QWeights w = MakeQuantized(fmt.quant, N, K, fmt.group, 41);
      const auto row = RandomFloats(K, 42);
      std::vector<float> want(N);
      MatMul(row.data(), 1, K, K, w.view(input), N, nullptr, want.data(), N, nullptr);
      for (int64_t M : {1, 3, 7, 16, 33}) {
        auto x = RandomFloats(M * K, 43 + M);
        for (int64_t pos : {int64_t{0}, M / 2, M - 1}) {
          auto xb = x;
          std::memcpy(xb.data() + pos * K, row.data(), K * sizeof(float));
          for (auto& pool : pools) {
            std::vector<float> y(M * N);
            MatMul(xb.data(), M, K, K, w.view(input), N, nullptr, y.data(), N, pool.get());
            ASSERT_EQ(0, std::memcmp(y.data() + pos * N, want.data(), N * sizeof(float)))
                << WeightQuantName(fmt.quant) << " M=" << M << " pos=" << pos
                << " threads=" << pool->size() << " input " << DTypeName(input);
          }
        }
      }
    }
  }
}

TEST_P(QuantMatMulTest, DequantizedWeightsWithinHalfAStep) {
  for (const Format& fmt : kFormats) {
    const int64_t N = 7, K = 300;
    const auto f = RandomFloats(N * K, 9, -0.7f, 1.3f);
    const QWeights w = MakeQuantized(fmt.quant, N, K, fmt.group, 9);
    const int64_t groups = fmt.quant == WeightQuant::kInt4 ? Int4Groups(K, fmt.group) : 1;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = fmt.quant == WeightQuant::kInt4 ? k / fmt.group : 0;
        float step = w.q.scales[n * groups + g];
        if (fmt.quant == WeightQuant::kFp8) {  // a 3-bit mantissa: 1/8 of the value's binade
          step = std::max(std::fabs(f[n * K + k]) / 8.0f, std::ldexp(step, -9));
        }
        ASSERT_LE(std::fabs(w.dequant[n * K + k] - f[n * K + k]), 0.5001f * step)
            << WeightQuantName(fmt.quant) << " n=" << n << " k=" << k;
      }
    }
  }
}

TANDEM_INSTANTIATE_PER_SIMD_LEVEL(QuantMatMulTest);

}  // namespace
}  // namespace tandem::cpu
