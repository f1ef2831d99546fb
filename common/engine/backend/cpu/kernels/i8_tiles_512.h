#pragma once

// MatMul with int8 inputs over int8 or int4 weights in WeightLayout::kTiles16 on 512-bit vectors:
// the arithmetic int8_inputs.h specifies and MatMulI8Reference spells out, bit for bit. Included
// by kernels_avx512vnni.cc (TANDEM_I8_512_VNNI 1: vpdpbusd) and kernels_avx512_i8.cc (0: AVX-512
// without VNNI, vpmaddubsw + vpmaddwd), each compiled with its tier's flags; everything here is
// in an anonymous namespace (internal linkage: each file has its own copy, README "ODR").
//
// Lane l of a tile's vectors is weight row 16t + l, so every accumulator holds 16 outputs and
// needs no reduction: per step one 64-byte load gives 16 rows x 4 elements (int8: as stored,
// q + 128; int4: two such operands, low and high nibbles), each the u8 operand of one vpdpbusd
// per input row against 4 of its codes broadcast. Without VNNI (as i8_tiles_256.h): int8 weights
// multiply as |q| (u8) by the input code negated where q < 0 (vpmaddubsw cannot saturate:
// 2 * 128 * 127 < 2^15), then vpmaddwd sums the pairs, the exact dot of q and a (no 128 sum(a)
// correction); int4 nibbles (u8) by the codes, both nibbles' pairs summed in int16 (2 * 2 * 15 *
// 127 < 2^15) before one vpmaddwd per step.

#if !defined(TANDEM_I8_512_VNNI)
#error "define TANDEM_I8_512_VNNI (0 or 1) before including i8_tiles_512.h"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/engine/backend/cpu/kernels/int8_inputs.h"
#include "common/engine/backend/cpu/kernels/tile_stream.h"

namespace tandem::cpu::internal {
namespace {

// Whether this file has vpdpbusd (the AVX512_VNNI tier) or emulates it (the AVX-512 tier).
constexpr bool kVnni512 = TANDEM_I8_512_VNNI != 0;

// Register tiles (input rows x tiles of 16 weight rows) per weight format, by input rows:
// * a lone row: kNT1 tiles (that many weight streams);
// * up to kDecodeMR rows: one 8x1 tile (each weight vector loaded once per step for the whole
//   batch);
// * up to kBatchMaxM rows (decode batches): kBatchMR x kBatchNT, 8x2 (the prefill tiles run
//   over L2 blocks of weights, and their passes after a block's first leave memory idle; one
//   16x1 pass costs a broadcast load per vpdpbusd);
// * more (prefill): kMR x kNT (int4 6x2: 12 int32 + 12 f32 accumulators; int8 6x3).
// Each is the fastest of the shapes tried (4x2, 4x3, 6x4, 8x3, 4x4, 16x1 among them).
template <WeightQuant Q>
struct Shapes;
template <>
struct Shapes<WeightQuant::kInt8> {
  static constexpr int kDecodeMR = 8, kDecodeNT = 1, kBatchMR = 8, kBatchNT = 2, kBatchMaxM = 32;
  static constexpr int kMR = 6, kNT = 3, kNT1 = 4;
  static int64_t TileBytes(int64_t K, int64_t /*group_size*/) {
    return kQuantTileRows * Int8TileK(K);
  }
};
template <>
struct Shapes<WeightQuant::kInt4> {
  static constexpr int kDecodeMR = 8, kDecodeNT = 1, kBatchMR = 8, kBatchNT = 2, kBatchMaxM = 32;
  static constexpr int kMR = 6, kNT = 2, kNT1 = 4;
  static int64_t TileBytes(int64_t K, int64_t group_size) { return Int4TileBytes(K, group_size); }
};

// Tiles hand their out-of-line epilogue a copy of the accumulators: given the accumulators
// themselves (their address escapes), GCC keeps them in memory through the tile's loop, one
// store per accumulator and step.
template <class V, int MR, int NR>
inline void CopyAccumulators(const V (&from)[MR][NR], V (&to)[MR][NR]) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) to[i][j] = from[i][j];
  }
}

// ---- int8 weights: the int32 lanes run over the whole row (exact: K <= 65536) ----

// y for a finished int8 register tile: ((float(dot - 128 sum(a)) * d) * s) + bias, stored in
// the lanes that are columns in [n0, n1).
template <int MR, int NT>
__attribute__((noinline)) void StoreInt8(const __m512i (&acc)[MR][NT], const I8Inputs& in,
                                         int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
                                         int64_t n1, const float* bias, float* y, int64_t ldy) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m512i offset = _mm512_set1_epi32(kVnni512 ? 128 * in.sum[m0 + i] : 0);
    const __m512 d = _mm512_set1_ps(in.scale[m0 + i]);
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + j;
      const __mmask16 m = TileMask(t, n0, n1);
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], offset));
      __m512 out = _mm512_mul_ps(_mm512_mul_ps(dot, d), _mm512_loadu_ps(wt.scales + 16 * t));
      if (bias != nullptr) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, bias + 16 * t));
      _mm512_mask_storeu_ps(y + (m0 + i) * ldy + 16 * t, m, out);
    }
  }
}

// y[m0 .. m0+MR) x the columns in [n0, n1) of tiles t0 .. t0+NT, int8 weights.
template <int MR, int NT, bool kPrefetch>
void TileInt8(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
              int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t code_stride = in.chunks * in.chunk;
  const int64_t tile_bytes = Shapes<WeightQuant::kInt8>::TileBytes(in.K, wt.group_size),
                steps = tile_bytes / 64;
  const uint8_t* q[NT];
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) q[j] = static_cast<const uint8_t*>(wt.data) + (t0 + j) * tile_bytes;
  const int8_t* a[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) a[i] = in.codes + (m0 + i) * code_stride;
  if constexpr (kPrefetch) {
    // The next register tile's scales (one line per tile) for its epilogue.
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(wt.scales + 16 * (t0 + NT + j)), _MM_HINT_T0);
    }
  }
  __m512i acc[MR][NT];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_si512();
  }
  for (int64_t p = 0; p < steps; ++p) {
    __m512i w[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      if constexpr (kPrefetch) {
        TilePrefetch<MR>(
            reinterpret_cast<const char*>(q[j] + PrefetchOffset<MR, NT>(p * 64, tile_bytes)));
      }
      w[j] = _mm512_loadu_si512(q[j] + p * 64);
    }
#if TANDEM_I8_512_VNNI
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t x;
      std::memcpy(&x, a[i] + p * 4, 4);
      const __m512i b = _mm512_set1_epi32(x);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], w[j], b);
    }
#else
    __m512i aw[NT];
    __mmask64 neg[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const __m512i ws = _mm512_xor_si512(w[j], _mm512_set1_epi8(-128));  // q
      aw[j] = _mm512_abs_epi8(ws);
      neg[j] = _mm512_movepi8_mask(ws);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t x;
      std::memcpy(&x, a[i] + p * 4, 4);
      const __m512i b = _mm512_set1_epi32(x);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const __m512i s = _mm512_mask_sub_epi8(b, neg[j], _mm512_setzero_si512(), b);
        acc[i][j] = _mm512_add_epi32(
            acc[i][j], _mm512_madd_epi16(_mm512_maddubs_epi16(aw[j], s), _mm512_set1_epi16(1)));
      }
    }
#endif
  }
  __m512i sums[MR][NT];
  CopyAccumulators(acc, sums);
  StoreInt8<MR, NT>(sums, in, m0, wt, t0, n0, n1, bias, y, ldy);
}

// acc += vpdpbusd(a0, b0) + vpdpbusd(a1, b1) (a u8, b s8), in place. With VNNI, inline
// assembly, not _mm512_dpbusd_epi32: with two of these into each accumulator per step (low and
// high nibbles), GCC 12 copies the accumulators from register to register around them, up to
// one move per vpdpbusd and spills in the 8x1 decode tile; written in place, the int4 loops have
// none. (The int8 tiles, one vpdpbusd per accumulator and step, compile without copies.)
// Without VNNI (int4 nibbles only: a <= 15): the two vpmaddubsw's int16 pairs summed, then one
// vpmaddwd.
inline void DpBusd2(__m512i& acc, __m512i a0, __m512i b0, __m512i a1, __m512i b1) {
#if TANDEM_I8_512_VNNI
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a0), "v"(b0));
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a1), "v"(b1));
#else
  const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(a0, b0), _mm512_maddubs_epi16(a1, b1));
  acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
#endif
}

// ---- int4 weights: per step of 8 elements the low nibbles hold elements 8p .. 8p + 3 and the
// high nibbles 8p + 4 .. 8p + 7. The int32 lanes hold one group's exact dot products, so per
// group and (input row, tile) one conversion and one FMA with the group's 16 scales (one load,
// after the group's steps in its block) finish it: 2 vpdpbusd per 8 x 16 products, the group's
// FMA spread over group / 8 steps. ----

// One group's term of an int4 register tile's zero correction: zc += (s_g * z_g) * A_g, per input
// row (A_g: the row's sum of input codes over the group).
template <int MR, int NT>
inline void AddZeroTerms(const uint8_t* const (&trailers)[NT], const I8Inputs& in, int64_t m0,
                         int64_t g, __m512 (&zc)[MR][NT]) {
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) {  // trailers[j]: the group's 16 scales, then its 16 zeros
    const __m512 sz =
        _mm512_mul_ps(_mm512_loadu_ps(trailers[j]), _mm512_loadu_ps(trailers[j] + 64));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      zc[i][j] =
          _mm512_fmadd_ps(sz, _mm512_set1_ps(in.group_sums[(m0 + i) * in.groups + g]), zc[i][j]);
    }
  }
}

// y for a finished int4 register tile from its sums r and zero corrections zc: ((r - zc) * d) +
// bias, stored in the lanes that are columns in [n0, n1). Out of line (and handed copies of the
// accumulators), so those stay in registers through the tile's loop.
template <int MR, int NT>
__attribute__((noinline)) void FinishInt4(const __m512 (&acc)[MR][NT], const __m512 (&zc)[MR][NT],
                                          const I8Inputs& in, int64_t m0, int64_t t0, int64_t n0,
                                          int64_t n1, const float* bias, float* y, int64_t ldy) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m512 d = _mm512_set1_ps(in.scale[m0 + i]);
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + j;
      const __mmask16 m = TileMask(t, n0, n1);
      __m512 out = _mm512_mul_ps(_mm512_sub_ps(acc[i][j], zc[i][j]), d);
      if (bias != nullptr) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, bias + 16 * t));
      _mm512_mask_storeu_ps(y + (m0 + i) * ldy + 16 * t, m, out);
    }
  }
}

// y for a finished int4 register tile whose zero corrections are still to be made: zc over the
// groups from the tiles' trailers (a second pass over their scale and zero lines), then
// FinishInt4.
template <int MR, int NT>
__attribute__((noinline)) void StoreInt4(const __m512 (&acc)[MR][NT], const I8Inputs& in,
                                         int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
                                         int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t gs = wt.group_size, tile_bytes = Int4TileBytes(in.K, gs);
  const uint8_t* tiles = static_cast<const uint8_t*>(wt.data) + t0 * tile_bytes;
  __m512 zc[MR][NT];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) zc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < in.groups; ++g) {
    const int64_t at = Int4TileGroupScales(in.K, g, gs);
    const uint8_t* trailers[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) trailers[j] = tiles + j * tile_bytes + at;
    AddZeroTerms<MR, NT>(trailers, in, m0, g, zc);
  }
  FinishInt4<MR, NT>(acc, zc, in, m0, t0, n0, n1, bias, y, ldy);
}

// y[m0 .. m0+MR) x the columns in [n0, n1) of tiles t0 .. t0+NT.
template <int MR, int NT, bool kPrefetch>
void TileInt4(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
              int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t code_stride = in.chunks * in.chunk, G = in.groups, gs = wt.group_size;
  const int64_t tile_bytes = Int4TileBytes(in.K, gs);
  const uint8_t* q[NT];
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) q[j] = static_cast<const uint8_t*>(wt.data) + (t0 + j) * tile_bytes;
  const int8_t* a[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) a[i] = in.codes + (m0 + i) * code_stride;
  __m512 acc[MR][NT];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  // Tiles of up to 8 accumulators add each group's zero correction right after its steps, while
  // its scale and zero lines are in L1; larger ones have no registers to spare for it and make
  // a second pass over those lines (StoreInt4). For a lone row that pass would read the
  // trailer lines back from beyond L1 after the whole tile had streamed, with no weight
  // prefetch going out meanwhile.
  constexpr bool kZerosInLoop = MR * NT <= 8;
  __m512 zc[MR][NT];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) zc[i][j] = _mm512_setzero_ps();
  }
  const __m512i nib = _mm512_set1_epi8(15);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t at = Int4TileGroupStart(g, gs), steps = Int4TileGroupSteps(in.K, g, gs);
    const int64_t trailer = Int4TileGroupScales(in.K, g, gs);  // 16 scales, then 16 zeros
    const int8_t* ag[MR];                                      // the group's input codes
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) ag[i] = a[i] + g * gs;
    if constexpr (kPrefetch) {
      // The block's scale and zero lines, as far ahead as its steps (which prefetch one line
      // each).
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        TilePrefetch<MR>(
            reinterpret_cast<const char*>(q[j] + PrefetchOffset<MR, NT>(trailer, tile_bytes)));
        TilePrefetch<MR>(
            reinterpret_cast<const char*>(q[j] + PrefetchOffset<MR, NT>(trailer + 64, tile_bytes)));
      }
    }
    __m512i dot[MR][NT];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) dot[i][j] = _mm512_setzero_si512();
    }
    for (int64_t p = 0; p < steps; ++p) {
      __m512i lo[NT], hi[NT];
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        if constexpr (kPrefetch) {
          TilePrefetch<MR>(reinterpret_cast<const char*>(
              q[j] + PrefetchOffset<MR, NT>(at + p * 64, tile_bytes)));
        }
        const __m512i v = _mm512_loadu_si512(q[j] + at + p * 64);
        lo[j] = _mm512_and_si512(v, nib);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        int32_t x0, x1;
        std::memcpy(&x0, ag[i] + p * 8, 4);
        std::memcpy(&x1, ag[i] + p * 8 + 4, 4);
        const __m512i b0 = _mm512_set1_epi32(x0), b1 = _mm512_set1_epi32(x1);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) {
          DpBusd2(dot[i][j], lo[j], b0, hi[j], b1);
        }
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const __m512 s = _mm512_loadu_ps(q[j] + trailer);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][j]), s, acc[i][j]);
      }
    }
    if constexpr (kZerosInLoop) {
      const uint8_t* trailers[NT];
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) trailers[j] = q[j] + trailer;
      AddZeroTerms<MR, NT>(trailers, in, m0, g, zc);
    }
  }
  __m512 sums[MR][NT];
  CopyAccumulators(acc, sums);
  if constexpr (kZerosInLoop) {
    __m512 corrections[MR][NT];
    CopyAccumulators(zc, corrections);
    FinishInt4<MR, NT>(sums, corrections, in, m0, t0, n0, n1, bias, y, ldy);
  } else {
    StoreInt4<MR, NT>(sums, in, m0, wt, t0, n0, n1, bias, y, ldy);
  }
}

template <WeightQuant Q, int MR, int NT, bool kPrefetch>
void Tile(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
          int64_t n1, const float* bias, float* y, int64_t ldy) {
  if constexpr (Q == WeightQuant::kInt4) {
    TileInt4<MR, NT, kPrefetch>(in, m0, wt, t0, n0, n1, bias, y, ldy);
  } else {
    TileInt8<MR, NT, kPrefetch>(in, m0, wt, t0, n0, n1, bias, y, ldy);
  }
}

using TileFn = void (*)(const I8Inputs&, int64_t, const MatMulWeight&, int64_t, int64_t, int64_t,
                        const float*, float*, int64_t);

template <WeightQuant Q, int NT, bool kPrefetch, int... I>
constexpr TileFn kTiles[] = {&Tile<Q, I / NT + 1, I % NT + 1, kPrefetch>...};

template <WeightQuant Q, int NT, bool kPrefetch, int... I>
constexpr const TileFn* TilesOf(std::integer_sequence<int, I...>) {
  return kTiles<Q, NT, kPrefetch, I...>;
}

// Columns [n0, n1): the tiles that hold them, in blocks that stay in L2 while every row tile
// passes over them (the first row tile of a block prefetches: it brings the block in from
// memory; the others find it in L2, where prefetching only costs, unless there are few rows),
// or, for a decode batch of two row tiles, both row tiles over each register tile of weights in
// turn (the second from L1, while the prefetches keep the next tiles streaming in; block by
// block, memory would idle while the second row tile ran from L2).
template <WeightQuant Q, int kMR, int kNT>
void Range(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias,
           float* y, int64_t ldy) {
  const int64_t M = in.M;
  const TileFn* first = TilesOf<Q, kNT, true>(std::make_integer_sequence<int, kMR * kNT>());
  const TileFn* rest =
      M <= 2 * kMR ? first : TilesOf<Q, kNT, false>(std::make_integer_sequence<int, kMR * kNT>());
  const int64_t t_begin = n0 / 16, t_end = (n1 + 15) / 16;
  constexpr int kNT1 = Shapes<Q>::kNT1;
  if (M == 1) {
    // One row tile: L2 blocks would only cut the weight streams short (a block of long rows
    // holds fewer than kNT1 tiles), so the lone-row tile runs over the whole range.
    int64_t t = t_begin;
    for (; t + kNT1 <= t_end; t += kNT1) Tile<Q, 1, kNT1, true>(in, 0, w, t, n0, n1, bias, y, ldy);
    static_assert(kNT1 == 4, "the remainder below covers up to 3 tiles");
    switch (t_end - t) {
      case 3:
        Tile<Q, 1, 3, true>(in, 0, w, t, n0, n1, bias, y, ldy);
        break;
      case 2:
        Tile<Q, 1, 2, true>(in, 0, w, t, n0, n1, bias, y, ldy);
        break;
      case 1:
        Tile<Q, 1, 1, true>(in, 0, w, t, n0, n1, bias, y, ldy);
        break;
    }
    return;
  }
  if (M > kMR && M <= 2 * kMR) {
    for (int64_t t = t_begin; t < t_end; t += kNT) {
      const int nt = static_cast<int>(t_end - t < kNT ? t_end - t : kNT);
      for (int64_t m = 0; m < M; m += kMR) {
        const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
        first[(mr - 1) * kNT + (nt - 1)](in, m, w, t, n0, n1, bias, y, ldy);
      }
    }
    return;
  }
  const int64_t tile_bytes = Shapes<Q>::TileBytes(in.K, w.group_size);
  int64_t block = tile_bytes > 0 ? kTileBlockBytes / tile_bytes / kNT * kNT : kNT;
  if (block < kNT) block = kNT;
  for (int64_t b0 = t_begin; b0 < t_end; b0 += block) {
    const int64_t b1 = b0 + block < t_end ? b0 + block : t_end;
    for (int64_t m = 0; m < M; m += kMR) {
      const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
      int64_t t = b0;
      const TileFn* tiles = m == 0 ? first : rest;
      for (; t < b1; t += kNT) {
        const int nt = static_cast<int>(b1 - t < kNT ? b1 - t : kNT);
        tiles[(mr - 1) * kNT + (nt - 1)](in, m, w, t, n0, n1, bias, y, ldy);
      }
    }
  }
}

template <WeightQuant Q>
void RangeOf(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias,
             float* y, int64_t ldy) {
  using S = Shapes<Q>;
  if (in.M <= S::kDecodeMR) {
    Range<Q, S::kDecodeMR, S::kDecodeNT>(in, w, n0, n1, bias, y, ldy);
  } else if (in.M <= S::kBatchMaxM) {
    Range<Q, S::kBatchMR, S::kBatchNT>(in, w, n0, n1, bias, y, ldy);
  } else {
    Range<Q, S::kMR, S::kNT>(in, w, n0, n1, bias, y, ldy);
  }
}

}  // namespace
}  // namespace tandem::cpu::internal
