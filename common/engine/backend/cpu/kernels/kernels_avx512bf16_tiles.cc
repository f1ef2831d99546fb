// MatMul with bf16 inputs on AVX512_BF16 over dense bf16 weights in WeightLayout::kTiles16
// (common/base/quant.h): 16 weight rows side by side, so lane l of a tile's vectors is weight row
// 16t + l and every accumulator holds 16 outputs (no reductions). Per step one 64-byte load gives
// 16 rows x one pair of elements, the operand of one vdpbf16ps per input row against that row's
// pair broadcast. Compiled with this ISA's flags only (see CMakeLists.txt); the dispatcher calls
// it only when the CPU has AVX512_BF16. Everything here has internal linkage except
// MatMulBf16TilesAvx512 (README.md, "ODR").
//
// Arithmetic of every output y[m, n] (its batch-invariance rule): one f32 lane starts at +0; for
// p = 0, 1, ..., Bf16TileK(K) / 2 - 1: lane = vdpbf16ps(lane, w[n, 2p:2p+2], x[m, 2p:2p+2]) (an
// odd K's last pair is (x[K-1], +0) against (w[n, K-1], +0)); then + bias[n]. Register tiles
// only choose which outputs are computed together.

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/engine/backend/cpu/kernels/kernels_internal.h"
#include "common/engine/backend/cpu/kernels/tile_stream.h"

namespace tandem::cpu::internal {
namespace {

inline __m512bh Bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// Register tiles (input rows x tiles of 16 weight rows): decode batches of up to kDecodeMR rows in
// one kDecodeMR x kDecodeNT tile (each weight vector loaded once per step for the whole batch),
// longer ones kMR x kNT (24 accumulators, 3 weight vectors, 1 broadcast), a lone row kNT1 tiles
// (that many weight streams). Each is the fastest of the shapes tried on AVX-512 (8x1 and 8x3
// for decode batches; 6x4, 4x4 and 12x2 beyond; 2 and 8 streams for a lone row).
constexpr int kDecodeMR = 8, kDecodeNT = 2, kMR = 8, kNT = 3, kNT1 = 4;
// Input pair p of a row, broadcast: (x[2p], x[2p + 1]), or (x[2p], +0) for an odd K's last one.
inline __m512bh Pair(const uint16_t* x, int64_t p, bool last_odd) {
  uint32_t v = x[2 * p];
  if (!last_odd) std::memcpy(&v, x + 2 * p, 4);
  return Bh(_mm512_set1_epi32(static_cast<int>(v)));
}

// y[m0 .. m0+MR) x the columns in [n0, n1) of tiles t0 .. t0+NT.
template <int MR, int NT, bool kPrefetch>
void Tile(const uint16_t* x, int64_t ldx, int64_t K, const uint16_t* w, int64_t m0, int64_t t0,
          int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t tile_bytes = Bf16TileBytes(K), steps = K / 2;
  const char* q[NT];
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) q[j] = reinterpret_cast<const char*>(w) + (t0 + j) * tile_bytes;
  const uint16_t* a[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) a[i] = x + (m0 + i) * ldx;
  __m512 acc[MR][NT];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < steps; ++p) {
    __m512bh wv[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      if constexpr (kPrefetch) {
        // (Not inline in the call: without optimization _mm_prefetch is a macro, and the
        // template's comma would split its arguments.)
        const char* ahead = q[j] + PrefetchOffset<MR, NT>(p * 64, tile_bytes);
        TilePrefetch<MR>(ahead);
      }
      wv[j] = Bh(_mm512_loadu_si512(q[j] + p * 64));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh b = Pair(a[i], p, false);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[j], b);
    }
  }
  if (K % 2 != 0) {  // the last pair: (w, +0) stored, (x[K - 1], +0) broadcast
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const __m512bh wv = Bh(_mm512_loadu_si512(q[j] + steps * 64));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, Pair(a[i], steps, true));
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) {
    const int64_t t = t0 + j;
    const __mmask16 m = TileMask(t, n0, n1);
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(m, bias + 16 * t) : __m512{};
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 out = bias != nullptr ? _mm512_add_ps(acc[i][j], b) : acc[i][j];
      _mm512_mask_storeu_ps(y + (m0 + i) * ldy + 16 * t, m, out);
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t,
                        int64_t, int64_t, const float*, float*, int64_t);

template <int NT, bool kPrefetch, int... I>
constexpr TileFn kTiles[] = {&Tile<I / NT + 1, I % NT + 1, kPrefetch>...};

template <int NT, bool kPrefetch, int... I>
constexpr const TileFn* TilesOf(std::integer_sequence<int, I...>) {
  return kTiles<NT, kPrefetch, I...>;
}

// Columns [n0, n1): the tiles that hold them. A lone row runs kNT1-tile register tiles over the
// whole range; one or two row tiles run each register tile of weights in turn (the second from
// L1 while the prefetches keep the next tiles streaming in); more go block by block, the blocks
// staying in L2 while every row tile passes over them (only the first prefetches: it brings the
// block in from memory).
template <int MR, int NT>
void Range(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t n0,
           int64_t n1, const float* bias, float* y, int64_t ldy) {
  const TileFn* first = TilesOf<NT, true>(std::make_integer_sequence<int, MR * NT>());
  const TileFn* rest =
      M <= 2 * MR ? first : TilesOf<NT, false>(std::make_integer_sequence<int, MR * NT>());
  const int64_t t_begin = n0 / 16, t_end = (n1 + 15) / 16;
  if (M == 1) {
    int64_t t = t_begin;
    for (; t + kNT1 <= t_end; t += kNT1) {
      Tile<1, kNT1, true>(x, ldx, K, w, 0, t, n0, n1, bias, y, ldy);
    }
    static_assert(kNT1 == 4, "the remainder below covers up to 3 tiles");
    switch (t_end - t) {
      case 3:
        Tile<1, 3, true>(x, ldx, K, w, 0, t, n0, n1, bias, y, ldy);
        break;
      case 2:
        Tile<1, 2, true>(x, ldx, K, w, 0, t, n0, n1, bias, y, ldy);
        break;
      case 1:
        Tile<1, 1, true>(x, ldx, K, w, 0, t, n0, n1, bias, y, ldy);
        break;
    }
    return;
  }
  if (M <= 2 * MR) {
    for (int64_t t = t_begin; t < t_end; t += NT) {
      const int nt = static_cast<int>(t_end - t < NT ? t_end - t : NT);
      for (int64_t m = 0; m < M; m += MR) {
        const int mr = static_cast<int>(M - m < MR ? M - m : MR);
        first[(mr - 1) * NT + (nt - 1)](x, ldx, K, w, m, t, n0, n1, bias, y, ldy);
      }
    }
    return;
  }
  const int64_t tile_bytes = Bf16TileBytes(K);
  int64_t block = tile_bytes > 0 ? kTileBlockBytes / tile_bytes / NT * NT : NT;
  if (block < NT) block = NT;
  for (int64_t b0 = t_begin; b0 < t_end; b0 += block) {
    const int64_t b1 = b0 + block < t_end ? b0 + block : t_end;
    for (int64_t m = 0; m < M; m += MR) {
      const int mr = static_cast<int>(M - m < MR ? M - m : MR);
      const TileFn* tiles = m == 0 ? first : rest;
      for (int64_t t = b0; t < b1; t += NT) {
        const int nt = static_cast<int>(b1 - t < NT ? b1 - t : NT);
        tiles[(mr - 1) * NT + (nt - 1)](x, ldx, K, w, m, t, n0, n1, bias, y, ldy);
      }
    }
  }
}

}  // namespace

void MatMulBf16TilesAvx512(const uint16_t* x, int64_t M, int64_t K, int64_t ldx,
                           const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias,
                           float* y, int64_t ldy) {
  const auto* tiles = static_cast<const uint16_t*>(w.data);
  if (M <= kDecodeMR) {
    Range<kDecodeMR, kDecodeNT>(x, M, K, ldx, tiles, n0, n1, bias, y, ldy);
  } else {
    Range<kMR, kNT>(x, M, K, ldx, tiles, n0, n1, bias, y, ldy);
  }
}

}  // namespace tandem::cpu::internal
