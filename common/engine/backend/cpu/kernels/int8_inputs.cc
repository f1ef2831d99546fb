// int8 MatMul inputs: the quantizer (shared by every path) and the scalar reference kernel, which
// spells out the VNNI kernel's arithmetic (see int8_inputs.h). Baseline flags,
// no contraction (CMakeLists.txt): every rounding here is explicit.

#include "common/engine/backend/cpu/kernels/int8_inputs.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace tandem::cpu::internal {
namespace {

// Round half to even for |v| <= 127 (adding and removing 1.5 * 2^23 leaves the integer part).
inline float RoundEven(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

}  // namespace

bool QuantizeRowI8Scale(float amax, bool finite, float* scale, float* inv) {
  *scale = 0.0f;
  if (!finite || !(amax > 0.0f)) return false;
  const float i = 127.0f / amax;
  if (!(i <= std::numeric_limits<float>::max())) return false;  // amax below 127 / FLT_MAX
  *inv = i;
  *scale = amax / 127.0f;
  return true;
}

void QuantizeRowI8Reference(const float* x, int64_t K, bool int4, int64_t group_size, int8_t* codes,
                            float* scale, int32_t* sum, float* group_sums) {
  *sum = 0;
  float amax = 0.0f;
  bool finite = true;  // a NaN anywhere makes max |x| NaN, not the max of the rest
  for (int64_t k = 0; k < K; ++k) {
    const float a = std::fabs(x[k]);
    amax = a > amax ? a : amax;
    finite = finite && a <= std::numeric_limits<float>::max();
  }
  float inv = 0.0f;
  if (!QuantizeRowI8Scale(amax, finite, scale, &inv)) return;  // codes and sums stay 0
  int32_t total = 0, group_sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    float v = RoundEven(x[k] * inv);
    v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
    const int32_t q = static_cast<int32_t>(v);
    codes[k] = static_cast<int8_t>(q);
    total += q;
    group_sum += q;
    if (int4 && ((k + 1) % group_size == 0 || k + 1 == K)) {
      group_sums[k / group_size] = static_cast<float>(group_sum);
      group_sum = 0;
    }
  }
  *sum = total;
}

I8Inputs QuantizeInputsI8(const float* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
                          I8InputBuffer* buffer, QuantizeRowI8Fn row, ThreadPool* pool) {
  I8Inputs in;
  in.quant = w.quant;
  in.M = M;
  in.K = K;
  const bool int4 = w.quant == WeightQuant::kInt4;
  in.chunk = int4 ? kInt4Chunk : 64;
  in.chunks = (K + in.chunk - 1) / in.chunk;
  in.groups = int4 ? Int4Groups(K, w.group_size) : 0;
  const int64_t code_stride = in.chunks * in.chunk;
  if (static_cast<int64_t>(buffer->codes.size()) < M * code_stride) {
    buffer->codes.resize(M * code_stride);
  }
  buffer->scale.resize(M);
  buffer->sum.resize(M);
  buffer->group_sums.assign(M * in.groups, 0.0f);
  const auto rows = [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      int8_t* codes = buffer->codes.data() + m * code_stride;
      std::memset(codes, 0, code_stride);
      (row != nullptr ? row : QuantizeRowI8Reference)(x + m * ldx, K, int4, w.group_size, codes,
                                                      &buffer->scale[m], &buffer->sum[m],
                                                      buffer->group_sums.data() + m * in.groups);
    }
  };
  if (pool != nullptr && pool->size() > 1 && M * K >= kQuantizeMinParallelElements) {
    pool->ParallelFor(M, rows);
  } else {
    rows(0, M);
  }
  in.codes = buffer->codes.data();
  in.scale = buffer->scale.data();
  in.sum = buffer->sum.data();
  in.group_sums = buffer->group_sums.data();
  return in;
}

void MatMulI8Reference(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                       const float* bias, float* y, int64_t ldy) {
  const int64_t K = in.K, code_stride = in.chunks * in.chunk;
  for (int64_t m = 0; m < in.M; ++m) {
    const int8_t* a = in.codes + m * code_stride;
    const float d = in.scale[m];
    for (int64_t n = n0; n < n1; ++n) {
      float out;
      if (in.quant == WeightQuant::kInt8) {
        // Row n is lane l of tile t: element k at byte 64 (k / 4) + 4l + k % 4, as q + 128.
        const int64_t t = n / kQuantTileRows, l = n % kQuantTileRows;
        const uint8_t* tile =
            static_cast<const uint8_t*>(w.data) + t * kQuantTileRows * Int8TileK(K);
        int32_t dot = 0;
        for (int64_t k = 0; k < K; ++k) dot += (tile[k / 4 * 64 + 4 * l + k % 4] - 128) * a[k];
        out = (static_cast<float>(dot) * d) * w.scales[n];
      } else {
        // Row n is lane l of tile t: element k in step k / 8 (of its group's block), byte
        // 4l + k % 4, the high nibble for k % 8 >= 4; the block's scales and zeros after its
        // steps, lane l.
        const int64_t G = in.groups, gs = w.group_size, l = n % kQuantTileRows;
        const uint8_t* tile =
            static_cast<const uint8_t*>(w.data) + n / kQuantTileRows * Int4TileBytes(K, gs);
        const float* sums = in.group_sums + m * G;
        float r = 0.0f, zc = 0.0f;
        for (int64_t g = 0; g < G; ++g) {
          const uint8_t* block = tile + Int4TileGroupStart(g, gs);
          const uint8_t* trailer = tile + Int4TileGroupScales(K, g, gs);
          int32_t dot = 0;
          const int64_t k0 = g * gs, k1 = k0 + gs < K ? k0 + gs : K;
          for (int64_t k = k0; k < k1; ++k) {
            const int32_t byte = block[(k - k0) / 8 * 64 + 4 * l + k % 4];
            dot += (k % 8 < 4 ? byte & 15 : byte >> 4) * a[k];
          }
          float sg, zg;
          std::memcpy(&sg, trailer + 4 * l, 4);
          std::memcpy(&zg, trailer + 64 + 4 * l, 4);
          r = std::fma(static_cast<float>(dot), sg, r);
          zc = std::fma(sg * zg, sums[g], zc);
        }
        out = (r - zc) * d;
      }
      if (bias != nullptr) out = out + bias[n];
      y[m * ldy + n] = out;
    }
  }
}

}  // namespace tandem::cpu::internal
