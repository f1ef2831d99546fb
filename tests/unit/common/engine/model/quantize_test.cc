// Load-time quantization layouts (common/base/quant.h): WeightLayout::kTiles16 holds exactly the
// codes, scales and zeros of kRows, at the positions quant.h gives, with whole tiles of padding
// (int8 codes stored + 128, padding as code 0; int4 scales and zeros in the tiles' group blocks);
// dense bf16 tiles hold the rows' elements.

#include "common/engine/model/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tandem {
namespace {

QuantizedMatrix Random(WeightQuant quant, int64_t N, int64_t K, int64_t group) {
  uint64_t state = 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(N * 1000 + K);
  return Quantize(
      quant, N, K, group,
      [&](int64_t, float* row) {
        for (int64_t k = 0; k < K; ++k) {
          state = state * 6364136223846793005ull + 1442695040888963407ull;
          row[k] = static_cast<float>(static_cast<int64_t>(state >> 40) % 2001 - 900) / 1000.0f;
        }
      },
      nullptr);
}

// Element k of row n in kRows: chunk k / 32, byte k % 16, high nibble for k % 32 >= 16.
int RowsCode(const QuantizedMatrix& m, int64_t n, int64_t k) {
  const uint8_t b = m.codes[n * Int4RowBytes(m.cols) + k / 32 * 16 + k % 16];
  return k % 32 < 16 ? b & 15 : b >> 4;
}

// kTiles16 int4, written out here on its own: a tile is 16 rows of K elements padded to 32 at
// half a byte each plus 128 bytes per group; group g's block starts at g (8 group + 128) and
// holds min(group, K32 - g group) / 8 steps of 64 bytes, then 16 f32 scales, then 16 zeros.
int64_t K32(const QuantizedMatrix& m) { return (m.cols + 31) / 32 * 32; }
int64_t TileBytes(const QuantizedMatrix& m) {
  return 16 * K32(m) / 2 + 128 * ((m.cols + m.group_size - 1) / m.group_size);
}
int64_t Block(const QuantizedMatrix& m, int64_t n, int64_t g) {
  return n / 16 * TileBytes(m) + g * (8 * m.group_size + 128);
}
int64_t BlockSteps(const QuantizedMatrix& m, int64_t g) {
  return std::min(m.group_size, K32(m) - g * m.group_size) / 8;
}

// Element k of row n: in its group's block step (k % group) / 8, byte 4 (n % 16) + k % 4, the
// high nibble for k % 8 >= 4.
int TilesCode(const QuantizedMatrix& m, int64_t n, int64_t k) {
  const int64_t g = k / m.group_size;
  const uint8_t b = m.codes[Block(m, n, g) + k % m.group_size / 8 * 64 + 4 * (n % 16) + k % 4];
  return k % 8 < 4 ? b & 15 : b >> 4;
}

// Scale (which 0) or zero (1) of row n, group g: after the block's steps, lane n % 16.
float TilesFloat(const QuantizedMatrix& m, int64_t n, int64_t g, int which) {
  float v;
  std::memcpy(&v, &m.codes[Block(m, n, g) + BlockSteps(m, g) * 64 + 64 * which + 4 * (n % 16)], 4);
  return v;
}

TEST(QuantizeTest, Int4Tiles16HoldsTheSameCodesScalesAndZeros) {
  for (const int64_t N : {1, 16, 37}) {
    for (const int64_t K : {32, 100, 200, 256}) {
      for (const int64_t group : {32, 128}) {
        const QuantizedMatrix rows = Random(WeightQuant::kInt4, N, K, group);
        QuantizedMatrix tiles = rows;
        ToTiles16(&tiles);
        ASSERT_EQ(tiles.layout, WeightLayout::kTiles16);
        const int64_t padded = QuantStoredRows(N, WeightLayout::kTiles16);
        const int64_t G = Int4Groups(K, group);
        ASSERT_EQ(padded % 16, 0);
        ASSERT_EQ(tiles.codes.size(), static_cast<size_t>(padded / 16 * TileBytes(tiles)));
        ASSERT_EQ(tiles.codes.size(),
                  static_cast<size_t>(padded * (Int4RowBytes(K) + 8 * G)));  // stored_bytes()
        EXPECT_TRUE(tiles.scales.empty());
        EXPECT_TRUE(tiles.zeros.empty());
        int distinct = 0;
        for (int64_t n = 0; n < padded; ++n) {
          for (int64_t k = 0; k < Int4RowBytes(K) * 2; ++k) {
            const int want = n < N && k < K ? RowsCode(rows, n, k) : 0;
            ASSERT_EQ(TilesCode(tiles, n, k), want)
                << "N=" << N << " K=" << K << " n=" << n << " k=" << k;
            distinct |= 1 << want;
          }
          for (int64_t g = 0; g < G; ++g) {
            EXPECT_EQ(TilesFloat(tiles, n, g, 0), n < N ? rows.scales[n * G + g] : 0.0f)
                << n << " " << g;
            EXPECT_EQ(TilesFloat(tiles, n, g, 1), n < N ? rows.zeros[n * G + g] : 0.0f)
                << n << " " << g;
          }
        }
        EXPECT_GT(__builtin_popcount(distinct), 8) << "the codes vary, so positions matter";
        QuantizedMatrix again = tiles;  // already in the layout: unchanged
        ToTiles16(&again);
        EXPECT_EQ(again.codes, tiles.codes);
      }
    }
  }
}

TEST(QuantizeTest, Int8Tiles16HoldsTheSameCodesPlus128AndScales) {
  for (const int64_t N : {1, 16, 37}) {
    for (const int64_t K : {1, 6, 100}) {
      const QuantizedMatrix rows = Random(WeightQuant::kInt8, N, K, 0);
      QuantizedMatrix tiles = rows;
      ToTiles16(&tiles);
      ASSERT_EQ(tiles.layout, WeightLayout::kTiles16);
      const int64_t padded = QuantStoredRows(N, WeightLayout::kTiles16), KT = Int8TileK(K);
      ASSERT_EQ(KT % 4, 0);
      ASSERT_GE(KT, K);
      ASSERT_EQ(tiles.codes.size(), static_cast<size_t>(padded * KT));
      ASSERT_EQ(tiles.scales.size(), static_cast<size_t>(padded));
      for (int64_t n = 0; n < padded; ++n) {
        for (int64_t k = 0; k < KT; ++k) {
          const int want = n < N && k < K ? static_cast<int8_t>(rows.codes[n * K + k]) : 0;
          const uint8_t got = tiles.codes[n / 16 * 16 * KT + k / 4 * 64 + 4 * (n % 16) + k % 4];
          ASSERT_EQ(got - 128, want) << "N=" << N << " K=" << K << " n=" << n << " k=" << k;
        }
        EXPECT_EQ(tiles.scales[n], n < N ? rows.scales[n] : 0.0f) << n;
      }
    }
  }
}

// Dense bf16 tiles, written out here on their own: a tile is 16 rows of K elements padded to
// even, step p holds element 2p + i of row 16t + l at element 32p + 2l + i; padding is +0.
TEST(QuantizeTest, Bf16Tiles16HoldTheSameElementsAndZeroPadding) {
  ThreadPool pool(2);
  for (const int64_t N : {1, 16, 37}) {
    for (const int64_t K : {1, 6, 101}) {
      std::vector<uint16_t> rows(static_cast<size_t>(N * K));
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint16_t>(0x3F80 + i % 1000);
      const int64_t padded = (N + 15) / 16 * 16, KT = (K + 1) / 2 * 2;
      ASSERT_EQ(Bf16TileBytes(K), 16 * KT * 2);
      std::vector<uint16_t> tiles(static_cast<size_t>(padded * KT), 0xFFFF);
      Bf16ToTiles16(rows.data(), N, K, tiles.data(), N == 37 ? &pool : nullptr);
      for (int64_t n = 0; n < padded; ++n) {
        for (int64_t k = 0; k < KT; ++k) {
          const uint16_t want = n < N && k < K ? rows[n * K + k] : 0;
          const int64_t at = n / 16 * 16 * KT + k / 2 * 32 + 2 * (n % 16) + k % 2;
          ASSERT_EQ(tiles[at], want) << "N=" << N << " K=" << K << " n=" << n << " k=" << k;
          ASSERT_EQ(Bf16TileIndex(K, n, k), at);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
