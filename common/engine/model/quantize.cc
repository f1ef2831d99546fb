#include "common/engine/model/quantize.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace tandem {

void QuantizeRow(WeightQuant quant, const float* w, int64_t K, int64_t group_size, uint8_t* codes,
                 float* scales, float* zeros) {
  if (quant == WeightQuant::kInt8) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(w[k]));
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    scales[0] = s;
    for (int64_t k = 0; k < K; ++k) {
      const float q = std::clamp(std::rint(w[k] / s), -127.0f, 127.0f);
      codes[k] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
    return;
  }
  if (quant == WeightQuant::kFp8) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(w[k]));
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    scales[0] = s;
    for (int64_t k = 0; k < K; ++k) codes[k] = Fp8E4M3Code(w[k] / s);
    return;
  }
  // int4: groups along K, packed in 32-element chunks (quant.h).
  const int64_t groups = Int4Groups(K, group_size);
  std::fill(codes, codes + Int4RowBytes(K), uint8_t{0});
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * group_size, k1 = std::min(K, k0 + group_size);
    float lo = 0.0f, hi = 0.0f;
    for (int64_t k = k0; k < k1; ++k) {
      lo = std::min(lo, w[k]);
      hi = std::max(hi, w[k]);
    }
    float s = (hi - lo) / 15.0f;
    if (!(s > 0.0f)) s = 1.0f;
    const float z = std::clamp(std::rint(-lo / s), 0.0f, 15.0f);
    scales[g] = s;
    zeros[g] = z;
    for (int64_t k = k0; k < k1; ++k) {
      const auto q = static_cast<uint8_t>(std::clamp(std::rint(w[k] / s) + z, 0.0f, 15.0f));
      const int64_t chunk = k / kInt4Chunk, j = k % kInt4Chunk;
      uint8_t& byte = codes[chunk * 16 + (j & 15)];
      byte = static_cast<uint8_t>(byte | (j < 16 ? q : q << 4));
    }
  }
}

namespace {

void Int8ToTiles16(QuantizedMatrix* m) {
  const int64_t N = m->rows, K = m->cols, KT = Int8TileK(K);
  const int64_t rows = QuantStoredRows(N, WeightLayout::kTiles16);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * KT), 128);  // code 0
  std::vector<float> scales(static_cast<size_t>(rows), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    uint8_t* tile = codes.data() + n / kQuantTileRows * kQuantTileRows * KT;
    const int64_t l = n % kQuantTileRows;
    for (int64_t k = 0; k < K; ++k) {
      tile[k / 4 * 64 + 4 * l + k % 4] = static_cast<uint8_t>(m->codes[n * K + k] ^ 0x80);
    }
    scales[n] = m->scales[n];
  }
  m->codes = std::move(codes);
  m->scales = std::move(scales);
  m->layout = WeightLayout::kTiles16;
}

}  // namespace

void ToTiles16(QuantizedMatrix* m) {
  // fp8 weights have no tiles (no int8 MatMul inputs take them): they stay in rows.
  if (m->quant == WeightQuant::kNone || m->quant == WeightQuant::kFp8 ||
      m->layout == WeightLayout::kTiles16) {
    return;
  }
  if (m->quant == WeightQuant::kInt8) {
    Int8ToTiles16(m);
    return;
  }
  const int64_t N = m->rows, K = m->cols, row_bytes = Int4RowBytes(K), gs = m->group_size;
  const int64_t G = Int4Groups(K, gs), tile_bytes = Int4TileBytes(K, gs);
  const int64_t tiles = QuantStoredRows(N, WeightLayout::kTiles16) / kQuantTileRows;
  std::vector<uint8_t> codes(static_cast<size_t>(tiles * tile_bytes), 0);  // padding: all 0
  for (int64_t n = 0; n < N; ++n) {
    const int64_t l = n % kQuantTileRows;
    const uint8_t* row = m->codes.data() + n * row_bytes;
    uint8_t* tile = codes.data() + n / kQuantTileRows * tile_bytes;
    for (int64_t g = 0; g < G; ++g) {
      uint8_t* block = tile + Int4TileGroupStart(g, gs);
      const int64_t steps = Int4TileGroupSteps(K, g, gs), p0 = g * (gs / 8);
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t k = 8 * (p0 + s);
        for (int64_t i = 0; i < 4; ++i) {
          block[s * 64 + 4 * l + i] =
              static_cast<uint8_t>(Int4RowCode(row, k + i) | Int4RowCode(row, k + 4 + i) << 4);
        }
      }
      float* trailer = reinterpret_cast<float*>(tile + Int4TileGroupScales(K, g, gs));
      trailer[l] = m->scales[n * G + g];
      trailer[kQuantTileRows + l] = m->zeros[n * G + g];
    }
  }
  m->codes = std::move(codes);
  m->scales.clear();
  m->zeros.clear();
  m->layout = WeightLayout::kTiles16;
}

void Bf16ToTiles16(const uint16_t* rows, int64_t N, int64_t K, uint16_t* tiles, ThreadPool* pool) {
  const int64_t tile_elems = Bf16TileBytes(K) / 2;
  const int64_t count = QuantStoredRows(N, WeightLayout::kTiles16) / kQuantTileRows;
  auto fill = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      uint16_t* tile = tiles + t * tile_elems;
      std::fill(tile, tile + tile_elems, uint16_t{0});
      for (int64_t n = t * kQuantTileRows; n < std::min(N, (t + 1) * kQuantTileRows); ++n) {
        for (int64_t k = 0; k < K; ++k) tiles[Bf16TileIndex(K, n, k)] = rows[n * K + k];
      }
    }
  };
  if (pool == nullptr) {
    fill(0, count);
  } else {
    pool->ParallelFor(count, fill);
  }
}

void DequantizeRow(WeightQuant quant, const uint8_t* codes, const float* scales, const float* zeros,
                   int64_t K, int64_t group_size, float* out) {
  if (quant == WeightQuant::kInt8) {
    for (int64_t k = 0; k < K; ++k) {
      out[k] = static_cast<float>(static_cast<int8_t>(codes[k])) * scales[0];
    }
    return;
  }
  if (quant == WeightQuant::kFp8) {
    const float s256 = scales[0] * 256.0f;  // as the kernels: code * 2^-8 times 256 * scale
    for (int64_t k = 0; k < K; ++k) out[k] = Fp8E4M3ValueScaled(codes[k]) * s256;
    return;
  }
  for (int64_t k = 0; k < K; ++k) {
    const int64_t g = k / group_size;
    out[k] = (static_cast<float>(Int4RowCode(codes, k)) - zeros[g]) * scales[g];
  }
}

bool ParseWeightQuant(const std::string& text, WeightQuant* out) {
  if (text == "none") {
    *out = WeightQuant::kNone;
  } else if (text == "int8") {
    *out = WeightQuant::kInt8;
  } else if (text == "int4") {
    *out = WeightQuant::kInt4;
  } else if (text == "fp8") {
    *out = WeightQuant::kFp8;
  } else {
    return false;
  }
  return true;
}

}  // namespace tandem
