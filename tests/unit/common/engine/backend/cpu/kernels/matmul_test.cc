// MatMul: accuracy against a double-precision reference and bit-exact batch invariance, for
// every SIMD level this CPU supports.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "tests/unit/common/engine/backend/cpu/kernels/kernel_test_util.h"

namespace tandem::cpu {
namespace {

using testing::PerSimdLevelTest;
using testing::RandomFloats;

// Weights of one dtype with their exact f32 values (for the reference).
struct Weights {
  DType dtype;
  std::vector<float> f32;      // values the kernel must multiply with
  std::vector<uint16_t> bf16;  // storage when dtype == kBF16
  const void* data() const {
    return dtype == DType::kBF16 ? static_cast<const void*>(bf16.data()) : f32.data();
  }
};

Weights MakeWeights(DType dtype, int64_t N, int64_t K, uint64_t seed) {
  Weights w{dtype, RandomFloats(N * K, seed), {}};
  if (dtype == DType::kBF16) {
    w.bf16 = testing::ToBf16(w.f32);
    w.f32 = testing::RoundTripBf16(w.f32);
  }
  return w;
}

void ExpectCloseToReference(const std::vector<float>& x, int64_t M, int64_t K, int64_t ldx,
                            const Weights& w, int64_t N, const float* bias,
                            const std::vector<float>& y, int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = bias != nullptr ? bias[n] : 0.0,
             mag = bias != nullptr ? std::fabs(bias[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(x[m * ldx + k]) * w.f32[n * K + k];
        ref += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(y[m * ldy + n], ref, 2e-6 * mag + 1e-30)
          << "m=" << m << " n=" << n << " M=" << M << " K=" << K << " N=" << N;
    }
  }
}

class MatMulTest : public PerSimdLevelTest {};

TEST_P(MatMulTest, MatchesReferenceOnOddShapes) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t K : {1, 15, 16, 17, 100, 257}) {
      for (int64_t N : {1, 3, 31, 40}) {
        for (int64_t M : {1, 2, 5, 9}) {
          const int64_t ldx = K + 3, ldy = N + 2;
          const auto x = RandomFloats(M * ldx, 1 + K * 7 + M);
          const Weights w = MakeWeights(dtype, N, K, 2 + N * 13 + K);
          const auto bias = RandomFloats(N, 3 + N);
          std::vector<float> y(M * ldy, -7.0f);
          MatMul(x.data(), M, K, ldx, w.data(), dtype, N, bias.data(), y.data(), ldy, nullptr);
          ExpectCloseToReference(x, M, K, ldx, w, N, bias.data(), y, ldy);
          MatMul(x.data(), M, K, ldx, w.data(), dtype, N, nullptr, y.data(), ldy, nullptr);
          ExpectCloseToReference(x, M, K, ldx, w, N, nullptr, y, ldy);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -7.0f) << "wrote padding";
          }
        }
      }
    }
  }
}

TEST_P(MatMulTest, MatchesReferenceAtModelShapesWithThreads) {
  ThreadPool pool(3);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t M = 37, K = 1000, N = 203;
    const auto x = RandomFloats(M * K, 11);
    const Weights w = MakeWeights(dtype, N, K, 12);
    std::vector<float> y(M * N);
    MatMul(x.data(), M, K, K, w.data(), dtype, N, nullptr, y.data(), N, &pool);
    ExpectCloseToReference(x, M, K, K, w, N, nullptr, y, N);
  }
}

// A row's output is bit-identical whatever the batch size, its position in the batch (main or
// remainder tile), the thread count (column partition) and the other rows.
TEST_P(MatMulTest, BatchInvariant) {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  struct Shape {
    int64_t K, N;
  };
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (Shape s : {Shape{1, 3}, Shape{17, 31}, Shape{100, 67}, Shape{515, 130}}) {
      const int64_t K = s.K, N = s.N;
      const Weights w = MakeWeights(dtype, N, K, 21 + K);
      const auto bias = RandomFloats(N, 22);
      const auto row = RandomFloats(K, 23 + K);
      std::vector<float> want(N);
      MatMul(row.data(), 1, K, K, w.data(), dtype, N, bias.data(), want.data(), N, nullptr);
      for (int64_t M : {1, 3, 7, 16, 33, 100}) {
        auto x = RandomFloats(M * K, 24 + M);
        for (int64_t pos : {int64_t{0}, M / 2, M - 1}) {
          auto xb = x;
          std::memcpy(xb.data() + pos * K, row.data(), K * sizeof(float));
          for (auto& pool : pools) {
            std::vector<float> y(M * N);
            MatMul(xb.data(), M, K, K, w.data(), dtype, N, bias.data(), y.data(), N, pool.get());
            ASSERT_EQ(0, std::memcmp(y.data() + pos * N, want.data(), N * sizeof(float)))
                << DTypeName(dtype) << " K=" << K << " N=" << N << " M=" << M << " pos=" << pos
                << " threads=" << pool->size();
          }
        }
      }
    }
  }
}

// Many rows take the K-blocked path (accumulators paused in memory between k chunks) and the
// pool; every row must equal the same row computed alone (streamed, full-K tiles).
TEST_P(MatMulTest, PrefillRowsEqualDecodeRows) {
  ThreadPool pool(2);
  for (int64_t K : {257, 300, 512, 784, 1031}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const int64_t M = 70, N = 101;
      const auto x = RandomFloats(M * K, 31 + K);
      const Weights w = MakeWeights(dtype, N, K, 32 + K);
      const auto bias = RandomFloats(N, 33);
      std::vector<float> y(M * N), y1(N);
      MatMul(x.data(), M, K, K, w.data(), dtype, N, bias.data(), y.data(), N, &pool);
      ExpectCloseToReference(x, M, K, K, w, N, bias.data(), y, N);
      for (int64_t m = 0; m < M; ++m) {
        MatMul(x.data() + m * K, 1, K, K, w.data(), dtype, N, bias.data(), y1.data(), N, nullptr);
        ASSERT_EQ(0, std::memcmp(y.data() + m * N, y1.data(), N * sizeof(float)))
            << "m=" << m << " K=" << K << " " << DTypeName(dtype);
      }
    }
  }
}

TEST_P(MatMulTest, ZeroKGivesBias) {
  const float bias[3] = {1.5f, -2.0f, 0.25f};
  float y[6];
  const float w = 0, x = 0;
  MatMul(&x, 2, 0, 0, &w, DType::kF32, 3, bias, y, 3, nullptr);
  for (int m = 0; m < 2; ++m) {
    for (int n = 0; n < 3; ++n) EXPECT_EQ(y[m * 3 + n], bias[n]);
  }
}

// bf16 inputs (MatMulWeight::input_dtype): each x element rounded to nearest-even bf16, the
// products exact, f32 sums: close to the double-precision sum over the rounded inputs, and every
// row bit-identical to that row alone, whatever M, its position, K's tail and the thread count.
TEST_P(MatMulTest, Bf16InputsMatchReferenceAndAreBatchInvariant) {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  for (int64_t K : {1, 31, 32, 33, 100, 515, 1031}) {
    const int64_t N = 67;
    const Weights w = MakeWeights(DType::kBF16, N, K, 41 + K);
    MatMulWeight mw;
    mw.data = w.data();
    mw.dtype = DType::kBF16;
    mw.input_dtype = DType::kBF16;
    const auto bias = RandomFloats(N, 42);
    const auto row = RandomFloats(K, 43 + K);
    std::vector<float> want(N);
    MatMul(row.data(), 1, K, K, mw, N, bias.data(), want.data(), N, nullptr);
    ExpectCloseToReference(testing::RoundTripBf16(row), 1, K, K, w, N, bias.data(), want, N);
    for (int64_t M : {1, 3, 7, 16, 33, 70}) {
      const int64_t ldx = K + 5;
      auto x = RandomFloats(M * ldx, 44 + M);
      for (int64_t pos : {int64_t{0}, M / 2, M - 1}) {
        auto xb = x;
        std::memcpy(xb.data() + pos * ldx, row.data(), K * sizeof(float));
        for (auto& pool : pools) {
          std::vector<float> y(M * N);
          MatMul(xb.data(), M, K, ldx, mw, N, bias.data(), y.data(), N, pool.get());
          ASSERT_EQ(0, std::memcmp(y.data() + pos * N, want.data(), N * sizeof(float)))
              << "K=" << K << " M=" << M << " pos=" << pos << " threads=" << pool->size();
          if (pos == 0 && pool->size() == 1) {
            ExpectCloseToReference(testing::RoundTripBf16(xb), M, K, ldx, w, N, bias.data(), y, N);
          }
        }
      }
    }
  }
}

// Rounding the inputs is what bf16 inputs mean: f32 inputs that are already bf16 values give
// the f32 path's products exactly, so both paths agree up to the order of the f32 sums.
TEST_P(MatMulTest, Bf16InputsEqualF32InputsOnBf16Values) {
  const int64_t M = 5, K = 300, N = 40;
  const auto x = testing::RoundTripBf16(RandomFloats(M * K, 51));
  const Weights w = MakeWeights(DType::kBF16, N, K, 52);
  MatMulWeight mw;
  mw.data = w.data();
  mw.dtype = DType::kBF16;
  std::vector<float> y32(M * N), y16(M * N);
  MatMul(x.data(), M, K, K, mw, N, nullptr, y32.data(), N, nullptr);
  mw.input_dtype = DType::kBF16;
  MatMul(x.data(), M, K, K, mw, N, nullptr, y16.data(), N, nullptr);
  if (internal::ActiveTier().bf16_dot) {
    // vdpbf16ps: the same products, summed pairwise into 16 lanes.
    for (int64_t i = 0; i < M * N; ++i) ASSERT_NEAR(y16[i], y32[i], 1e-4f) << i;
  } else {
    // The f32 kernels on the rounded inputs: the same bits.
    ASSERT_EQ(0, std::memcmp(y16.data(), y32.data(), y32.size() * sizeof(float)));
  }
}

TANDEM_INSTANTIATE_PER_SIMD_LEVEL(MatMulTest);

// The public entry points follow ActiveSimdLevel() (and so the TANDEM_SIMD cap) by default: the
// best tier with kernels at or below it.
TEST(KernelDispatchTest, DefaultLevelIsActiveSimdLevel) {
  const auto levels = internal::SupportedSimdLevels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), SimdLevel::kScalar);
  SimdLevel want = SimdLevel::kScalar;
  for (SimdLevel l : levels) {
    if (l <= ActiveSimdLevel()) want = l;
  }
  EXPECT_EQ(internal::CurrentSimdLevel(), want);
  for (SimdLevel l : levels) {
    ASSERT_TRUE(internal::SetSimdLevelForTesting(l));
    EXPECT_EQ(internal::CurrentSimdLevel(), l);
  }
  internal::ResetSimdLevelForTesting();
}

}  // namespace
}  // namespace tandem::cpu
