// MatMul over dense bf16 weights in WeightLayout::kTiles16 with bf16 inputs: close to the
// double-precision reference, bit-exact batch invariance (any M, row position, thread count,
// column split), and off AVX512_BF16 the same bits as the weights in rows.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/model/quantize.h"
#include "tests/unit/common/engine/backend/cpu/kernels/kernel_test_util.h"

namespace tandem::cpu {
namespace {

using testing::PerSimdLevelTest;
using testing::RandomFloats;

// One bf16 matrix [N, K] in rows and in tiles, with its exact values.
struct Bf16Matrix {
  int64_t N = 0, K = 0;
  std::vector<float> values;
  std::vector<uint16_t> rows, tiles;
  MatMulWeight Rows() const {
    MatMulWeight w;
    w.data = rows.data();
    w.dtype = DType::kBF16;
    w.input_dtype = DType::kBF16;
    return w;
  }
  MatMulWeight Tiles() const {
    MatMulWeight w = Rows();
    w.data = tiles.data();
    w.layout = WeightLayout::kTiles16;
    return w;
  }
};

Bf16Matrix MakeMatrix(int64_t N, int64_t K, uint64_t seed) {
  Bf16Matrix m;
  m.N = N;
  m.K = K;
  m.values = testing::RoundTripBf16(RandomFloats(N * K, seed));
  m.rows = testing::ToBf16(m.values);
  const int64_t tiles = (N + 15) / 16;
  m.tiles.assign(tiles * Bf16TileBytes(K) / 2, 0xFFFF);  // garbage: the converter pads
  Bf16ToTiles16(m.rows.data(), N, K, m.tiles.data(), nullptr);
  return m;
}

// |y - reference| within the error of one f32 chain of K sums (two per pair).
void ExpectCloseToReference(const std::vector<float>& x, int64_t M, int64_t ldx,
                            const Bf16Matrix& w, const float* bias, const float* y, int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < w.N; ++n) {
      double ref = bias != nullptr ? bias[n] : 0.0, mag = std::fabs(ref);
      for (int64_t k = 0; k < w.K; ++k) {
        const double p = static_cast<double>(x[m * ldx + k]) * w.values[n * w.K + k];
        ref += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(y[m * ldy + n], ref, 6e-8 * (w.K + 2) * mag + 1e-30)
          << "m=" << m << " n=" << n << " M=" << M << " K=" << w.K << " N=" << w.N;
    }
  }
}

class MatMulBf16TilesTest : public PerSimdLevelTest {};

TEST_P(MatMulBf16TilesTest, MatchesReferenceAndIsBatchInvariant) {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  for (int64_t K : {1, 2, 31, 33, 100, 515, 1031}) {
    for (int64_t N : {5, 16, 67}) {
      const Bf16Matrix w = MakeMatrix(N, K, 41 + K + N);
      const MatMulWeight tiles = w.Tiles();
      const auto bias = RandomFloats(N, 42);
      const auto row = RandomFloats(K, 43 + K);
      std::vector<float> want(N);
      MatMul(row.data(), 1, K, K, tiles, N, bias.data(), want.data(), N, nullptr);
      ExpectCloseToReference(testing::RoundTripBf16(row), 1, K, w, bias.data(), want.data(), N);
      for (int64_t M : {1, 2, 7, 8, 9, 16, 17, 33, 70}) {
        const int64_t ldx = K + 5;
        auto x = RandomFloats(M * ldx, 44 + M);
        for (int64_t pos : {int64_t{0}, M / 2, M - 1}) {
          auto xb = x;
          std::memcpy(xb.data() + pos * ldx, row.data(), K * sizeof(float));
          for (auto& pool : pools) {
            const int64_t ldy = N + 3;
            std::vector<float> y(M * ldy, -7.0f);
            MatMul(xb.data(), M, K, ldx, tiles, N, bias.data(), y.data(), ldy, pool.get());
            ASSERT_EQ(0, std::memcmp(y.data() + pos * ldy, want.data(), N * sizeof(float)))
                << "K=" << K << " N=" << N << " M=" << M << " pos=" << pos
                << " threads=" << pool->size();
            for (int64_t m = 0; m < M; ++m) {  // nothing written past the N columns
              for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -7.0f);
            }
            if (pos == 0 && pool->size() == 1) {
              ExpectCloseToReference(testing::RoundTripBf16(xb), M, ldx, w, bias.data(), y.data(),
                                     ldy);
            }
          }
        }
      }
    }
  }
}

// A lone row over long ranges (register tiles of 4 tiles, then the 1-3 left over): the same bits
// as that row in a batch of two (8x2 register tiles), with one range (no pool) and with a pool's
// ranges, and close to the reference.
TEST_P(MatMulBf16TilesTest, LoneRowLongRangesEqualBatchedRows) {
  ThreadPool pool(2);
  for (int64_t K : {33, 512}) {
    for (int64_t N : {16 * 8, 16 * 9 + 5, 16 * 14 + 7, 16 * 131 + 3}) {
      const Bf16Matrix w = MakeMatrix(N, K, 91 + N);
      const auto x = RandomFloats(2 * K, 92 + K);
      std::vector<float> pair(2 * N);
      MatMul(x.data(), 2, K, K, w.Tiles(), N, nullptr, pair.data(), N, nullptr);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> y(N, -7.0f);
        MatMul(x.data() + K, 1, K, K, w.Tiles(), N, nullptr, y.data(), N, p);
        ASSERT_EQ(0, std::memcmp(y.data(), pair.data() + N, N * sizeof(float)))
            << "K=" << K << " N=" << N << " pool=" << (p != nullptr);
        const std::vector<float> row(x.begin() + K, x.end());
        ExpectCloseToReference(testing::RoundTripBf16(row), 1, K, w, nullptr, y.data(), N);
      }
    }
  }
}

// Off AVX512_BF16 the tiles are turned back into rows for the f32 kernels: the same bits as the
// rows. On it, vdpbf16ps sums them in another order than the rows' kernel: close.
TEST_P(MatMulBf16TilesTest, TilesEqualRows) {
  const int64_t M = 5, K = 300, N = 40;
  const Bf16Matrix w = MakeMatrix(N, K, 52);
  const auto x = RandomFloats(M * K, 51);
  std::vector<float> rows(M * N), tiles(M * N);
  MatMul(x.data(), M, K, K, w.Rows(), N, nullptr, rows.data(), N, nullptr);
  MatMul(x.data(), M, K, K, w.Tiles(), N, nullptr, tiles.data(), N, nullptr);
  if (internal::ActiveTier().bf16_dot) {
    for (int64_t i = 0; i < M * N; ++i) ASSERT_NEAR(tiles[i], rows[i], 1e-4f) << i;
  } else {
    ASSERT_EQ(0, std::memcmp(tiles.data(), rows.data(), rows.size() * sizeof(float)));
  }
}

// Projections side by side (MatMulShared): a projection's columns start mid-tile in the split,
// each output still equals its own MatMul bit for bit.
TEST_P(MatMulBf16TilesTest, SharedProjectionsEqualTheirOwnMatMuls) {
  const int64_t K = 96;
  const Bf16Matrix a = MakeMatrix(67, K, 61), b = MakeMatrix(45, K, 62);
  const auto bias = RandomFloats(67, 63);
  ThreadPool pool(3);
  for (int64_t M : {1, 4, 12}) {
    const auto x = RandomFloats(M * K, 64 + M);
    std::vector<float> ya(M * 67), yb(M * 45), wa(M * 67), wb(M * 45);
    const MatMulProjection p[2] = {{a.Tiles(), 67, bias.data(), ya.data(), 67},
                                   {b.Tiles(), 45, nullptr, yb.data(), 45}};
    MatMulShared(x.data(), M, K, K, p, 2, &pool);
    MatMul(x.data(), M, K, K, a.Tiles(), 67, bias.data(), wa.data(), 67, nullptr);
    MatMul(x.data(), M, K, K, b.Tiles(), 45, nullptr, wb.data(), 45, nullptr);
    ASSERT_EQ(0, std::memcmp(ya.data(), wa.data(), wa.size() * sizeof(float))) << M;
    ASSERT_EQ(0, std::memcmp(yb.data(), wb.data(), wb.size() * sizeof(float))) << M;
  }
}

TANDEM_INSTANTIATE_PER_SIMD_LEVEL(MatMulBf16TilesTest);

}  // namespace
}  // namespace tandem::cpu
