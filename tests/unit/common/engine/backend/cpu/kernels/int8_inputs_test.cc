// int8 MatMul inputs (MatMulWeight::input_dtype kI8, int8_inputs.h): the quantizer's codes,
// scales and sums, the VNNI kernel bit-exact against the scalar reference (across K tails, groups,
// tiles, blocks of rows and threads), bit-exact batch invariance, and the error within the bound
// that the input quantization allows, for every SIMD level this CPU supports.

#include "common/engine/backend/cpu/kernels/int8_inputs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
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
                           {WeightQuant::kInt4, 64},
                           {WeightQuant::kInt4, 128},
                           {WeightQuant::kInt4, 256}};

std::string Name(const Format& f) {
  return std::string(WeightQuantName(f.quant)) + " g=" + std::to_string(f.group);
}

// Codes are round-half-even of x * 127 / amax over the row, the scale amax / 127, the sums
// those of the codes (int4: per weight group), and a row of zeros or with a non-finite value
// quantizes to nothing.
TEST(Int8InputsTest, QuantizerCodesScalesAndSums) {
  const int64_t K = 100;
  std::vector<float> x(4 * K, 0.0f);
  for (int64_t k = 0; k < K; ++k) x[k] = 0.5f * static_cast<float>(k % 40) - 10.25f;
  x[7] = 127.0f;  // row 0: amax 127, so codes are x rounded half to even
  x[K + 3] = std::numeric_limits<float>::infinity();    // row 1: not finite; row 2: zeros
  for (int64_t k = 0; k < K; ++k) x[3 * K + k] = 1.0f;  // row 3: a NaN among ones
  x[3 * K + 50] = std::numeric_limits<float>::quiet_NaN();
  MatMulWeight w;
  w.quant = WeightQuant::kInt8;
  internal::I8InputBuffer buffer;
  internal::I8Inputs in = internal::QuantizeInputsI8(x.data(), 4, K, K, w, &buffer);
  ASSERT_EQ(in.chunks, 2);
  int32_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    EXPECT_EQ(in.codes[k], static_cast<int8_t>(std::nearbyint(x[k]))) << k;
    sum += in.codes[k];
  }
  EXPECT_EQ(in.codes[0], -10);  // -10.25
  EXPECT_EQ(in.codes[1], -10);  // -9.75
  EXPECT_EQ(in.codes[2], -9);   // -9.25
  for (int64_t k = K; k < 128; ++k) EXPECT_EQ(in.codes[k], 0) << "padding " << k;
  EXPECT_EQ(in.scale[0], 1.0f);
  EXPECT_EQ(in.sum[0], sum);
  for (int64_t m = 1; m < 4; ++m) {
    EXPECT_EQ(in.scale[m], 0.0f) << m;
    EXPECT_EQ(in.sum[m], 0) << m;
    for (int64_t k = 0; k < 128; ++k) ASSERT_EQ(in.codes[m * 128 + k], 0) << m << " " << k;
  }
  // int4: codes in element order too (rows padded to 32), group sums per 32-element group.
  w.quant = WeightQuant::kInt4;
  w.group_size = 32;
  in = internal::QuantizeInputsI8(x.data(), 1, K, K, w, &buffer);
  ASSERT_EQ(in.chunks, 4);
  ASSERT_EQ(in.groups, 4);
  for (int64_t k = 0; k < K; ++k) {
    EXPECT_EQ(in.codes[k], static_cast<int8_t>(std::nearbyint(x[k]))) << k;
  }
  for (int64_t k = K; k < 128; ++k) EXPECT_EQ(in.codes[k], 0) << "padding " << k;
  for (int64_t g = 0; g < 4; ++g) {
    float want = 0;
    for (int64_t k = 32 * g; k < K && k < 32 * g + 32; ++k) want += std::nearbyint(x[k]);
    EXPECT_EQ(in.group_sums[g], want) << g;
  }
}

// A row whose max |x| is so small that 127 / max overflows quantizes to nothing too.
TEST(Int8InputsTest, QuantizerTinyRowQuantizesToNothing) {
  std::vector<float> x(40, 0.0f);
  x[3] = 1e-38f;
  x[9] = -2e-38f;
  MatMulWeight w;
  w.quant = WeightQuant::kInt8;
  internal::I8InputBuffer buffer;
  const internal::I8Inputs in = internal::QuantizeInputsI8(x.data(), 1, 40, 40, w, &buffer);
  EXPECT_EQ(in.scale[0], 0.0f);
  EXPECT_EQ(in.sum[0], 0);
  for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(in.codes[k], 0) << k;
}

class Int8InputsTest : public PerSimdLevelTest {};

// The tier's row quantizer equals the reference bit for bit: codes at their layout positions,
// padding, scales, sums and int4 group sums, over K tails, group sizes, both code offsets, rows
// split over threads, and rows of zeros, tiny, huge, infinite or NaN values.
TEST_P(Int8InputsTest, TierQuantizerEqualsReference) {
  const internal::QuantizeRowI8Fn row = internal::ActiveTier().quantize_i8;
  if (row == nullptr) GTEST_SKIP() << "this tier quantizes with the reference itself";
  ThreadPool pool(2);
  for (const Format& f : kFormats) {
    for (int64_t K : {1, 15, 16, 17, 100, 128, 300, 2048}) {
      const int64_t M = 9;
      std::vector<float> x = RandomFloats(M * K, 1000 + K);
      for (int64_t k = 0; k < K; ++k) {
        x[1 * K + k] = 0.0f;
        x[2 * K + k] = 1e-39f * static_cast<float>(k % 3);
        x[3 * K + k] *= 3e38f;
        x[4 * K + k] = 0.5f * static_cast<float>(k % 9) - 2.0f;  // halves: ties to even
      }
      x[5 * K + K / 2] = std::numeric_limits<float>::infinity();
      x[6 * K + K - 1] = -std::numeric_limits<float>::infinity();
      x[7 * K + K / 3] = std::numeric_limits<float>::quiet_NaN();
      x[8 * K + K - 1] = -7.0f;  // the largest magnitude last (the masked tail)
      const QWeights w = MakeQuantized(f.quant, 4, K, f.group, 5);
      internal::I8InputBuffer ref_buffer, avx_buffer;
      const internal::I8Inputs ref =
          internal::QuantizeInputsI8(x.data(), M, K, K, w.view(DType::kI8), &ref_buffer);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const internal::I8Inputs avx =
            internal::QuantizeInputsI8(x.data(), M, K, K, w.view(DType::kI8), &avx_buffer, row, p);
        const std::string what = Name(f) + " K=" + std::to_string(K);
        ASSERT_EQ(avx.chunks, ref.chunks) << what;
        for (int64_t m = 0; m < M; ++m) {
          EXPECT_EQ(std::memcmp(&avx.scale[m], &ref.scale[m], sizeof(float)), 0)
              << what << " " << m;
          EXPECT_EQ(avx.sum[m], ref.sum[m]) << what << " " << m;
          for (int64_t g = 0; g < ref.groups; ++g) {
            EXPECT_EQ(avx.group_sums[m * ref.groups + g], ref.group_sums[m * ref.groups + g])
                << what << " row " << m << " group " << g;
          }
        }
        const int64_t bytes = M * ref.chunks * ref.chunk;
        for (int64_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(avx.codes[i], ref.codes[i]) << what << " byte " << i;
        }
      }
    }
  }
}

// What MatMul computes (VNNI where this level and CPU have it) is the reference, bit for bit.
TEST_P(Int8InputsTest, EqualsReference) {
  ThreadPool pool(2);
  for (const Format& fmt : kFormats) {
    for (int64_t K : {1, 31, 32, 33, 64, 100, 127, 128, 129, 300, 515, 1031}) {
      for (int64_t N : {1, 5, 9, 67}) {
        const QWeights w = MakeQuantized(fmt.quant, N, K, fmt.group, 5 + K * 3 + N);
        for (int64_t M : {1, 2, 3, 5, 7, 9}) {
          const int64_t ldx = K + 3, ldy = N + 2;
          const auto x = RandomFloats(M * ldx, 7 + K + M, -3.0f, 2.0f);
          const auto bias = RandomFloats(N, 3 + N);
          std::vector<float> y(M * ldy, -7.0f), ref(M * ldy, -7.0f);
          MatMul(x.data(), M, K, ldx, w.view(DType::kI8), N, bias.data(), y.data(), ldy, &pool);
          internal::I8InputBuffer buffer;
          const internal::I8Inputs in =
              internal::QuantizeInputsI8(x.data(), M, K, ldx, w.view(DType::kI8), &buffer);
          internal::MatMulI8Reference(in, w.view(DType::kI8), 0, N, bias.data(), ref.data(), ldy);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
              << Name(fmt) << " K=" << K << " N=" << N << " M=" << M;
        }
      }
    }
  }
}

// The quantized inputs change each product by at most half a step: the result is within
// sum_k |w_k| * d / 2 (d = max |x| / 127 of the row, plus f32 rounding) of the exact sum over
// the dequantized weights, and far closer than that on average.
TEST_P(Int8InputsTest, WithinTheInputQuantizationBound) {
  for (const Format& fmt : kFormats) {
    const int64_t M = 3, K = 515, N = 40;
    const QWeights w = MakeQuantized(fmt.quant, N, K, fmt.group, 17);
    const auto x = RandomFloats(M * K, 18, -3.0f, 2.0f);
    std::vector<float> y(M * N);
    MatMul(x.data(), M, K, K, w.view(DType::kI8), N, nullptr, y.data(), N, nullptr);
    double err_sum = 0, bound_sum = 0;
    for (int64_t m = 0; m < M; ++m) {
      double amax = 0;
      for (int64_t k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(x[m * K + k]));
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, bound = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double wk = w.dequant[n * K + k], xk = x[m * K + k];
          exact += wk * xk;
          bound += std::fabs(wk) * amax / 127 / 2;
          mag += std::fabs(wk * xk);
        }
        const double err = std::fabs(y[m * N + n] - exact);
        ASSERT_LE(err, bound + 1e-5 * mag) << Name(fmt) << " m=" << m << " n=" << n;
        err_sum += err;
        bound_sum += bound;
      }
    }
    // Rounding errors mostly cancel: the mean error is a small fraction of the worst case.
    EXPECT_LT(err_sum, 0.2 * bound_sum) << Name(fmt);
  }
}

TEST_P(Int8InputsTest, BatchInvariant) {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  for (const Format& fmt : kFormats) {
    const int64_t K = 300, N = 130;
    const QWeights w = MakeQuantized(fmt.quant, N, K, fmt.group, 41);
    const auto row = RandomFloats(K, 42);
    std::vector<float> want(N);
    MatMul(row.data(), 1, K, K, w.view(DType::kI8), N, nullptr, want.data(), N, nullptr);
    for (int64_t M : {1, 3, 7, 16, 24, 33}) {
      auto x = RandomFloats(M * K, 43 + M);
      for (int64_t pos : {int64_t{0}, M / 2, M - 1}) {
        auto xb = x;
        std::memcpy(xb.data() + pos * K, row.data(), K * sizeof(float));
        for (auto& pool : pools) {
          std::vector<float> y(M * N);
          MatMul(xb.data(), M, K, K, w.view(DType::kI8), N, nullptr, y.data(), N, pool.get());
          ASSERT_EQ(0, std::memcmp(y.data() + pos * N, want.data(), N * sizeof(float)))
              << Name(fmt) << " M=" << M << " pos=" << pos << " threads=" << pool->size();
        }
      }
    }
  }
}

// Larger shapes: several L2 blocks of weight rows and every register tile, against the reference.
TEST_P(Int8InputsTest, LargeShapesEqualReference) {
  ThreadPool pool(2);
  for (const Format& fmt : {kFormats[0], kFormats[1], kFormats[3]}) {
    const int64_t K = 2048, N = 700;
    const QWeights w = MakeQuantized(fmt.quant, N, K, fmt.group, 71);
    // Every tile shape: decode, batch (7: a whole row tile and one of 3 over each register tile
    // of weights on the AVX2 int4 path), prefill (30 and 33: last row tiles of 2 and 1 rows).
    for (int64_t M : {1, 4, 7, 16, 20, 30, 33}) {
      const auto x = RandomFloats(M * K, 72 + M);
      std::vector<float> y(M * N), ref(M * N);
      MatMul(x.data(), M, K, K, w.view(DType::kI8), N, nullptr, y.data(), N, &pool);
      internal::I8InputBuffer buffer;
      const internal::I8Inputs in =
          internal::QuantizeInputsI8(x.data(), M, K, K, w.view(DType::kI8), &buffer);
      internal::MatMulI8Reference(in, w.view(DType::kI8), 0, N, nullptr, ref.data(), N);
      ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
          << Name(fmt) << " M=" << M;
    }
  }
}

// A lone row over long ranges: register tiles of 4 tiles front to back, then the 1-3 tiles left
// over (every remainder), one range (no pool) and ranges from a pool, against the reference.
TEST_P(Int8InputsTest, LoneRowLongRangesEqualReference) {
  ThreadPool pool(2);
  for (const Format& fmt : kFormats) {
    for (int64_t K : {300, 1031}) {
      for (int64_t N : {16 * 8, 16 * 9 + 5, 16 * 14 + 7, 16 * 67 + 3}) {
        const QWeights w = MakeQuantized(fmt.quant, N, K, fmt.group, 81 + N);
        const auto x = RandomFloats(K, 82 + K);
        internal::I8InputBuffer buffer;
        const internal::I8Inputs in =
            internal::QuantizeInputsI8(x.data(), 1, K, K, w.view(DType::kI8), &buffer);
        std::vector<float> ref(N);
        internal::MatMulI8Reference(in, w.view(DType::kI8), 0, N, nullptr, ref.data(), N);
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          std::vector<float> y(N, -7.0f);
          MatMul(x.data(), 1, K, K, w.view(DType::kI8), N, nullptr, y.data(), N, p);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), N * sizeof(float)))
              << Name(fmt) << " K=" << K << " N=" << N << " pool=" << (p != nullptr);
        }
      }
    }
  }
}

TANDEM_INSTANTIATE_PER_SIMD_LEVEL(Int8InputsTest);

}  // namespace
}  // namespace tandem::cpu
