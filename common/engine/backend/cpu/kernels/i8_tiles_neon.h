#pragma once

// MatMul with int8 inputs over int8 / int4 weights in WeightLayout::kTiles16 on aarch64: the
// arithmetic int8_inputs.h specifies and MatMulI8Reference spells out, bit for bit. Included by
// kernels_neon_i8.cc (TANDEM_I8_NEON_MODE 0: smull + saddlp, the neon tier),
// kernels_neon_dot_i8.cc (1: sdot, neon-dotprod) and kernels_neon_i8mm_i8.cc (2: usdot,
// neon-i8mm), each compiled with its tier's flags; everything here is in an anonymous namespace
// (internal linkage, README "ODR").
//
// A 64-byte step of a tile is 16 weight rows x 4 elements; its four 16-byte quarters are rows
// 4q .. 4q + 3, so lane l of quarter q's int32x4 accumulator is weight row 16t + 4q + l, and
// one sdot / usdot (4 products per lane) against 4 input codes taken from a lane of a 16-byte
// load (the _laneq forms) adds a step for 4 rows. int8 weights: sdot (and smull) multiply the
// signed codes (stored byte ^ 0x80); usdot the stored bytes q + 128 (u8), corrected by
// 128 sum(a) at the end. int4: all multiply the nibbles (0..15, the same as u8 or s8). smull
// multiplies 8 bytes into int16 (|q a| <= 128 * 127), saddlp adds pairs into int32, addp the
// pairs of a row.

#if !defined(TANDEM_I8_NEON_MODE)
#error "define TANDEM_I8_NEON_MODE (0, 1 or 2) before including i8_tiles_neon.h"
#endif

#include <arm_neon.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/engine/backend/cpu/kernels/int8_inputs.h"
#include "common/engine/backend/cpu/kernels/tile_stream.h"

namespace tandem::cpu::internal {
namespace {

constexpr bool kUsdot = TANDEM_I8_NEON_MODE == 2;

// Register tiles (input rows x tiles of 16 weight rows; 4 int32x4 accumulators per pair): a lone
// row kNT1 tiles, up to kSmallM rows kSmallMR x 1, more kMR x 1 (32 vector registers).
template <WeightQuant Q>
struct ShapesNeon;
template <>
struct ShapesNeon<WeightQuant::kInt8> {
  static constexpr int kNT1 = 4, kSmallM = 4, kSmallMR = 4, kMR = 5;
  static int64_t TileBytes(int64_t K, int64_t /*group_size*/) {
    return kQuantTileRows * Int8TileK(K);
  }
};
template <>
struct ShapesNeon<WeightQuant::kInt4> {
  static constexpr int kNT1 = 2, kSmallM = 2, kSmallMR = 2, kMR = 3;
  static int64_t TileBytes(int64_t K, int64_t group_size) { return Int4TileBytes(K, group_size); }
};

// acc += the dot products of the 4 rows of w (4 signed bytes each) with the input codes
// a[4 lane .. 4 lane + 3].
template <int kLane>
inline int32x4_t DotSigned(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if TANDEM_I8_NEON_MODE == 0
  const int8x16_t b = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(a), kLane));
  const int16x8_t p01 = vmull_s8(vget_low_s8(w), vget_low_s8(b));  // rows 0, 1
  const int16x8_t p23 = vmull_high_s8(w, b);                       // rows 2, 3
  return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(p01), vpaddlq_s16(p23)));
#else
  return vdotq_laneq_s32(acc, w, a, kLane);
#endif
}

// The same for int8 weights as stored (q + 128): signed codes, or with usdot the bytes as they
// are.
template <int kLane>
inline int32x4_t Dot(int32x4_t acc, uint8x16_t w, int8x16_t a) {
#if TANDEM_I8_NEON_MODE == 2
  return vusdotq_laneq_s32(acc, w, a, kLane);
#else
  return DotSigned<kLane>(acc, vreinterpretq_s8_u8(veorq_u8(w, vdupq_n_u8(0x80))), a);
#endif
}

template <int kLane>
inline int32x4_t DotNibbles(int32x4_t acc, uint8x16_t w, int8x16_t a) {
  return DotSigned<kLane>(acc, vreinterpretq_s8_u8(w), a);
}

// Stores out (+ bias) to the lanes of quarter hv (weight rows 4hv .. 4hv + 3) that are columns in
// [n0, n1), row y.
inline void StoreQuarter(float32x4_t out, int64_t hv, int64_t n0, int64_t n1, const float* bias,
                         float* y) {
  const int64_t c0 = 4 * hv;
  if (c0 >= n0 && c0 + 4 <= n1) {
    if (bias != nullptr) out = vaddq_f32(out, vld1q_f32(bias + c0));
    vst1q_f32(y + c0, out);
    return;
  }
  float lanes[4];
  vst1q_f32(lanes, out);
  for (int l = 0; l < 4; ++l) {
    const int64_t c = c0 + l;
    if (c < n0 || c >= n1) continue;
    y[c] = bias != nullptr ? lanes[l] + bias[c] : lanes[l];
  }
}

// ---- int8 weights ----

template <int MR, int NT>
__attribute__((noinline)) void StoreInt8(const int32x4_t (&acc)[MR][4 * NT], const I8Inputs& in,
                                         int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
                                         int64_t n1, const float* bias, float* y, int64_t ldy) {
  for (int i = 0; i < MR; ++i) {
    const int32x4_t offset = vdupq_n_s32(kUsdot ? 128 * in.sum[m0 + i] : 0);
    const float32x4_t d = vdupq_n_f32(in.scale[m0 + i]);
    for (int j = 0; j < 4 * NT; ++j) {
      const int64_t hv = 4 * t0 + j;
      const float32x4_t dot = vcvtq_f32_s32(vsubq_s32(acc[i][j], offset));
      const float32x4_t out = vmulq_f32(vmulq_f32(dot, d), vld1q_f32(wt.scales + 4 * hv));
      StoreQuarter(out, hv, n0, n1, bias, y + (m0 + i) * ldy);
    }
  }
}

// y[m0 .. m0+MR) x the columns in [n0, n1) of tiles t0 .. t0+NT, int8 weights. Steps go four
// at a time (one 16-byte load of each input row's codes, a lane per step; the codes are padded
// to whole 64-element chunks, so the load stays inside the row).
template <int MR, int NT, bool kPrefetch>
void TileInt8(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
              int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t code_stride = in.chunks * in.chunk;
  const int64_t tile_bytes = ShapesNeon<WeightQuant::kInt8>::TileBytes(in.K, 0),
                steps = tile_bytes / 64;
  const uint8_t* q[NT];
  for (int j = 0; j < NT; ++j) q[j] = static_cast<const uint8_t*>(wt.data) + (t0 + j) * tile_bytes;
  const int8_t* a[MR];
  for (int i = 0; i < MR; ++i) a[i] = in.codes + (m0 + i) * code_stride;
  int32x4_t acc[MR][4 * NT];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < 4 * NT; ++j) acc[i][j] = vdupq_n_s32(0);
  }
  const auto step = [&]<int kLane>(int64_t p, const int8x16_t(&b)[MR]) {
    for (int j = 0; j < NT; ++j) {
      if constexpr (kPrefetch) {
        TilePrefetch<MR>(q[j] + PrefetchOffset<MR, NT>(p * 64, tile_bytes));
      }
      for (int h = 0; h < 4; ++h) {
        const uint8x16_t w = vld1q_u8(q[j] + p * 64 + 16 * h);
        for (int i = 0; i < MR; ++i) acc[i][4 * j + h] = Dot<kLane>(acc[i][4 * j + h], w, b[i]);
      }
    }
  };
  int64_t p = 0;
  for (; p + 4 <= steps; p += 4) {
    int8x16_t b[MR];
    for (int i = 0; i < MR; ++i) b[i] = vld1q_s8(a[i] + p * 4);
    step.template operator()<0>(p, b);
    step.template operator()<1>(p + 1, b);
    step.template operator()<2>(p + 2, b);
    step.template operator()<3>(p + 3, b);
  }
  if (p < steps) {  // 1-3 steps left: their codes, then zeros (the chunk's padding)
    int8x16_t b[MR];
    for (int i = 0; i < MR; ++i) b[i] = vld1q_s8(a[i] + p * 4);
    step.template operator()<0>(p, b);
    if (p + 1 < steps) step.template operator()<1>(p + 1, b);
    if (p + 2 < steps) step.template operator()<2>(p + 2, b);
  }
  int32x4_t sums[MR][4 * NT];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < 4 * NT; ++j) sums[i][j] = acc[i][j];
  }
  StoreInt8<MR, NT>(sums, in, m0, wt, t0, n0, n1, bias, y, ldy);
}

// ---- int4 weights: per step of 8 elements the low nibbles hold elements 8p .. 8p + 3 and the
// high nibbles 8p + 4 .. 8p + 7; a group's int32 lanes are its exact dot products, then one
// conversion and one FMA with the group's 4 scales of the quarter. ----

template <int MR, int NT>
__attribute__((noinline)) void StoreInt4(const float32x4_t (&r)[MR][4 * NT], const I8Inputs& in,
                                         int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
                                         int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t gs = wt.group_size, tile_bytes = Int4TileBytes(in.K, gs);
  const uint8_t* tiles = static_cast<const uint8_t*>(wt.data) + t0 * tile_bytes;
  for (int j = 0; j < 4 * NT; ++j) {
    const uint8_t* tile = tiles + (j / 4) * tile_bytes + 16 * (j % 4);
    float32x4_t zc[MR];
    for (int i = 0; i < MR; ++i) zc[i] = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < in.groups; ++g) {
      const uint8_t* trailer = tile + Int4TileGroupScales(in.K, g, gs);  // scales, zeros 64 on
      const float32x4_t sz = vmulq_f32(vld1q_f32(reinterpret_cast<const float*>(trailer)),
                                       vld1q_f32(reinterpret_cast<const float*>(trailer + 64)));
      for (int i = 0; i < MR; ++i) {
        zc[i] = vfmaq_f32(zc[i], sz, vdupq_n_f32(in.group_sums[(m0 + i) * in.groups + g]));
      }
    }
    const int64_t hv = 4 * t0 + j;
    for (int i = 0; i < MR; ++i) {
      const float32x4_t out = vmulq_f32(vsubq_f32(r[i][j], zc[i]), vdupq_n_f32(in.scale[m0 + i]));
      StoreQuarter(out, hv, n0, n1, bias, y + (m0 + i) * ldy);
    }
  }
}

template <int MR, int NT, bool kPrefetch>
void TileInt4(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
              int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t code_stride = in.chunks * in.chunk, G = in.groups, gs = wt.group_size;
  const int64_t tile_bytes = Int4TileBytes(in.K, gs);
  const uint8_t* q[NT];
  for (int j = 0; j < NT; ++j) q[j] = static_cast<const uint8_t*>(wt.data) + (t0 + j) * tile_bytes;
  float32x4_t r[MR][4 * NT];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < 4 * NT; ++j) r[i][j] = vdupq_n_f32(0.0f);
  }
  const uint8x16_t nib = vdupq_n_u8(15);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t at = Int4TileGroupStart(g, gs), steps = Int4TileGroupSteps(in.K, g, gs);
    const int64_t trailer = Int4TileGroupScales(in.K, g, gs);
    int32x4_t dot[MR][4 * NT];
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < 4 * NT; ++j) dot[i][j] = vdupq_n_s32(0);
    }
    // Two steps per 16-byte load of each row's codes (8 codes a step: lanes 0, 1 then 2, 3).
    const auto step = [&]<int kLane>(int64_t p, const int8x16_t(&b)[MR]) {
      for (int j = 0; j < NT; ++j) {
        if constexpr (kPrefetch) {
          TilePrefetch<MR>(q[j] + PrefetchOffset<MR, NT>(at + p * 64, tile_bytes));
        }
        for (int h = 0; h < 4; ++h) {
          const uint8x16_t v = vld1q_u8(q[j] + at + p * 64 + 16 * h);
          const uint8x16_t lo = vandq_u8(v, nib), hi = vshrq_n_u8(v, 4);
          for (int i = 0; i < MR; ++i) {
            dot[i][4 * j + h] = DotNibbles<kLane>(dot[i][4 * j + h], lo, b[i]);
            dot[i][4 * j + h] = DotNibbles<kLane + 1>(dot[i][4 * j + h], hi, b[i]);
          }
        }
      }
    };
    int64_t p = 0;
    for (; p + 2 <= steps; p += 2) {
      int8x16_t b[MR];
      for (int i = 0; i < MR; ++i) {
        b[i] = vld1q_s8(in.codes + (m0 + i) * code_stride + g * gs + 8 * p);
      }
      step.template operator()<0>(p, b);
      step.template operator()<2>(p + 1, b);
    }
    if (p < steps) {  // an odd step left (none in today's layout: groups hold 4k steps)
      int8x16_t b[MR];
      for (int i = 0; i < MR; ++i) {
        b[i] =
            vcombine_s8(vld1_s8(in.codes + (m0 + i) * code_stride + g * gs + 8 * p), vdup_n_s8(0));
      }
      step.template operator()<0>(p, b);
    }
    for (int j = 0; j < 4 * NT; ++j) {
      const float32x4_t s =
          vld1q_f32(reinterpret_cast<const float*>(q[j / 4] + trailer + 16 * (j % 4)));
      for (int i = 0; i < MR; ++i) r[i][j] = vfmaq_f32(r[i][j], vcvtq_f32_s32(dot[i][j]), s);
    }
  }
  StoreInt4<MR, NT>(r, in, m0, wt, t0, n0, n1, bias, y, ldy);
}

template <WeightQuant Q, int MR, int NT, bool kPrefetch>
void TileNeon(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
              int64_t n1, const float* bias, float* y, int64_t ldy) {
  if constexpr (Q == WeightQuant::kInt4) {
    TileInt4<MR, NT, kPrefetch>(in, m0, wt, t0, n0, n1, bias, y, ldy);
  } else {
    TileInt8<MR, NT, kPrefetch>(in, m0, wt, t0, n0, n1, bias, y, ldy);
  }
}

using TileNeonFn = void (*)(const I8Inputs&, int64_t, const MatMulWeight&, int64_t, int64_t,
                            int64_t, const float*, float*, int64_t);

template <WeightQuant Q, int NT, bool kPrefetch, int... I>
constexpr TileNeonFn kTilesNeon[] = {&TileNeon<Q, I / NT + 1, I % NT + 1, kPrefetch>...};

template <WeightQuant Q, int NT, bool kPrefetch, int... I>
constexpr const TileNeonFn* TilesNeonOf(std::integer_sequence<int, I...>) {
  return kTilesNeon<Q, NT, kPrefetch, I...>;
}

// Columns [n0, n1): a lone row over kNT1-tile register tiles front to back; more rows in L2
// blocks of tiles, each passed over by every row tile of kMR rows (the first prefetching).
template <WeightQuant Q, int kMR>
void RangeNeon(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias,
               float* y, int64_t ldy) {
  using S = ShapesNeon<Q>;
  const int64_t M = in.M;
  const int64_t t_begin = n0 / 16, t_end = (n1 + 15) / 16;
  if (M == 1) {
    constexpr int kNT1 = S::kNT1;
    const TileNeonFn* lone = TilesNeonOf<Q, kNT1, true>(std::make_integer_sequence<int, kNT1>());
    for (int64_t t = t_begin; t < t_end; t += kNT1) {
      const int nt = static_cast<int>(t_end - t < kNT1 ? t_end - t : kNT1);
      lone[nt - 1](in, 0, w, t, n0, n1, bias, y, ldy);
    }
    return;
  }
  const TileNeonFn* first = TilesNeonOf<Q, 1, true>(std::make_integer_sequence<int, kMR>());
  const TileNeonFn* rest =
      M <= 2 * kMR ? first : TilesNeonOf<Q, 1, false>(std::make_integer_sequence<int, kMR>());
  const int64_t tile_bytes = S::TileBytes(in.K, w.group_size);
  int64_t block = tile_bytes > 0 ? kTileBlockBytes / tile_bytes : 1;
  if (block < 1) block = 1;
  for (int64_t b0 = t_begin; b0 < t_end; b0 += block) {
    const int64_t b1 = b0 + block < t_end ? b0 + block : t_end;
    for (int64_t m = 0; m < M; m += kMR) {
      const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
      const TileNeonFn* tiles = m == 0 ? first : rest;
      for (int64_t t = b0; t < b1; ++t) tiles[mr - 1](in, m, w, t, n0, n1, bias, y, ldy);
    }
  }
}

template <WeightQuant Q>
void RangeOfNeon(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                 const float* bias, float* y, int64_t ldy) {
  using S = ShapesNeon<Q>;
  if (in.M <= S::kSmallM) {
    RangeNeon<Q, S::kSmallMR>(in, w, n0, n1, bias, y, ldy);
  } else {
    RangeNeon<Q, S::kMR>(in, w, n0, n1, bias, y, ldy);
  }
}

void MatMulI8Neon(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                  const float* bias, float* y, int64_t ldy) {
  if (in.quant == WeightQuant::kInt4) {
    RangeOfNeon<WeightQuant::kInt4>(in, w, n0, n1, bias, y, ldy);
  } else {
    RangeOfNeon<WeightQuant::kInt8>(in, w, n0, n1, bias, y, ldy);
  }
}

}  // namespace
}  // namespace tandem::cpu::internal
