#pragma once

// MatMul with int8 inputs over int8 / int4 weights in WeightLayout::kTiles16 on 256-bit vectors:
// the arithmetic int8_inputs.h specifies and MatMulI8Reference spells out, bit for bit. One
// template for two tiers: kVnni false is AVX2 (vpmaddubsw + vpmaddwd; kernels_avx2_i8.cc),
// true is AVX-VNNI (vpdpbusd on ymm; kernels_avxvnni_i8.cc). Included only by those two files,
// each compiled with its tier's flags; everything here is in an anonymous namespace (internal
// linkage: each file has its own copy, README "ODR").
//
// A 64-byte step of a tile holds 16 weight rows x 4 elements (int8: q + 128; int4: 16 rows x 8
// elements in nibbles); its two 32-byte halves are rows 0-7 and 8-15, so lane l of a half's
// accumulator is weight row 16t + 8h + l and needs no horizontal sum, as in the 512-bit kernel.
//
// Products without VNNI (vpmaddubsw multiplies u8 by s8 and adds pairs into int16, saturating):
// * int8: u8 = |w| (w = stored byte ^ 0x80, so |w| <= 128) and s8 = the input code negated
//   where w < 0 (vpsignb): pairs |w| |a| + |w'| |a'| <= 2 * 128 * 127 < 2^15, no saturation;
//   vpmaddwd with ones then sums the pairs into int32: the exact dot of w and a.
// * int4: u8 = the nibble (<= 15), s8 = the code: a pair is at most 2 * 15 * 127 = 3810, so the
//   int16 lanes sum the two nibbles of 4 steps (32 elements: 8 x 3810 < 2^15) before one
//   vpmaddwd into the int32 group sum.
// With VNNI the u8 operand is the stored byte (int8: q + 128, corrected by 128 * sum(a) at the
// end, as the 512-bit kernel) or the nibble.

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/engine/backend/cpu/kernels/int8_inputs.h"
#include "common/engine/backend/cpu/kernels/tile_stream.h"

namespace tandem::cpu::internal {
namespace {

using Acc = __m256i;

// Register tiles (input rows x tiles of 16 weight rows; each tile is two 8-lane halves):
// a lone row kNT1 tiles (that many weight streams), up to kSmallM rows kSmallMR x kSmallNT, more
// kMR x kNT. 16 ymm registers bound them: int8 holds 2 * MR * NT int32 accumulators; int4 with
// VNNI as many int32 group sums and f32 results, without VNNI (TileInt4Runs) only 2 * MR * NT
// int16 sums, its other accumulators in L1. kLonePrefetch: whether a lone row's tiles prefetch
// their weight streams (tile_stream.h). The AVX2 int4 lone row does not: on Zen 3 its NTA
// prefetches, 1 KiB ahead in each stream, kept the hardware's stream prefetcher from running
// ahead, and batch-1 decode read well below the memory's bandwidth with them (kernels README,
// "Streaming"); four streams rather than two for the same reason.
template <bool kVnni, WeightQuant Q>
struct Shapes256;
template <bool kVnni>
struct Shapes256<kVnni, WeightQuant::kInt8> {
  static constexpr int kNT1 = 4, kSmallM = 4, kSmallMR = 4, kSmallNT = 1, kMR = 4, kNT = 1;
  static constexpr bool kLonePrefetch = true;
  static int64_t TileBytes(int64_t K, int64_t /*group_size*/) {
    return kQuantTileRows * Int8TileK(K);
  }
};
template <>
struct Shapes256<true, WeightQuant::kInt4> {
  static constexpr int kNT1 = 2, kSmallM = 2, kSmallMR = 2, kSmallNT = 1, kMR = 2, kNT = 1;
  static constexpr bool kLonePrefetch = true;
  static int64_t TileBytes(int64_t K, int64_t group_size) { return Int4TileBytes(K, group_size); }
};
template <>
struct Shapes256<false, WeightQuant::kInt4> {
  static constexpr int kNT1 = 4, kSmallM = 2, kSmallMR = 2, kSmallNT = 1, kMR = 4, kNT = 1;
  static constexpr bool kLonePrefetch = false;
  static int64_t TileBytes(int64_t K, int64_t group_size) { return Int4TileBytes(K, group_size); }
};

template <class V, int MR, int NR>
inline void CopyAccs(const V (&from)[MR][NR], V (&to)[MR][NR]) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) to[i][j] = from[i][j];
  }
}

// Lanes of half hv (weight rows 8hv .. 8hv + 7) that are columns in [n0, n1), as a maskload /
// maskstore mask; *full when all eight are.
inline __m256i HalfMask(int64_t hv, int64_t n0, int64_t n1, bool* full) {
  const int64_t lo = n0 > 8 * hv ? n0 - 8 * hv : 0;
  const int64_t hi = n1 - 8 * hv < 8 ? n1 - 8 * hv : 8;
  *full = lo == 0 && hi == 8;
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo)), idx),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), idx));
}

// Stores out (+ bias) to the lanes of half hv that are columns in [n0, n1), row y.
inline void StoreHalf(__m256 out, int64_t hv, int64_t n0, int64_t n1, const float* bias, float* y) {
  bool full = false;
  const __m256i m = HalfMask(hv, n0, n1, &full);
  if (full) {
    if (bias != nullptr) out = _mm256_add_ps(out, _mm256_loadu_ps(bias + 8 * hv));
    _mm256_storeu_ps(y + 8 * hv, out);
  } else {
    if (bias != nullptr) out = _mm256_add_ps(out, _mm256_maskload_ps(bias + 8 * hv, m));
    _mm256_maskstore_ps(y + 8 * hv, m, out);
  }
}

inline __m256i Broadcast4(const int8_t* p) {
  int32_t x;
  std::memcpy(&x, p, 4);
  return _mm256_set1_epi32(x);
}

// acc += the exact dot products of one int8 step (u: 8 rows x 4 stored bytes q + 128) with the
// input codes b (4 codes broadcast). Without VNNI, ws = q and aw = |q| come from PrepInt8.
template <bool kVnni>
inline void DotInt8(Acc& acc, __m256i u, __m256i ws, __m256i aw, __m256i b, __m256i ones16) {
  if constexpr (kVnni) {
#if defined(__AVXVNNI__)
    acc = _mm256_dpbusd_avx_epi32(acc, u, b);
#endif
  } else {
    const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(b, ws));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones16));
  }
}

// ---- int8 weights ----

// y for a finished int8 register tile: ((float(dot) * d) * s) + bias (dot = acc, or with VNNI
// acc - 128 sum(a)), stored in the lanes that are columns in [n0, n1).
template <bool kVnni, int MR, int NT>
__attribute__((noinline)) void StoreInt8(const Acc (&acc)[MR][2 * NT], const I8Inputs& in,
                                         int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
                                         int64_t n1, const float* bias, float* y, int64_t ldy) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m256i offset = _mm256_set1_epi32(kVnni ? 128 * in.sum[m0 + i] : 0);
    const __m256 d = _mm256_set1_ps(in.scale[m0 + i]);
#pragma GCC unroll 8
    for (int j = 0; j < 2 * NT; ++j) {
      const int64_t hv = 2 * t0 + j;
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i][j], offset));
      const __m256 out = _mm256_mul_ps(_mm256_mul_ps(dot, d), _mm256_loadu_ps(wt.scales + 8 * hv));
      StoreHalf(out, hv, n0, n1, bias, y + (m0 + i) * ldy);
    }
  }
}

// y[m0 .. m0+MR) x the columns in [n0, n1) of tiles t0 .. t0+NT, int8 weights.
template <bool kVnni, int MR, int NT, bool kPrefetch>
void TileInt8(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
              int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t code_stride = in.chunks * in.chunk;
  const int64_t tile_bytes = Shapes256<kVnni, WeightQuant::kInt8>::TileBytes(in.K, 0),
                steps = tile_bytes / 64;
  const uint8_t* q[NT];
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) q[j] = static_cast<const uint8_t*>(wt.data) + (t0 + j) * tile_bytes;
  const int8_t* a[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) a[i] = in.codes + (m0 + i) * code_stride;
  Acc acc[MR][2 * NT];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < 2 * NT; ++j) acc[i][j] = _mm256_setzero_si256();
  }
  const __m256i ones16 = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(-128);
  for (int64_t p = 0; p < steps; ++p) {
    __m256i b[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) b[i] = Broadcast4(a[i] + p * 4);
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      if constexpr (kPrefetch) {
        TilePrefetch<MR>(q[j] + PrefetchOffset<MR, NT>(p * 64, tile_bytes));
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i u =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[j] + p * 64 + 32 * h));
        __m256i ws = u, aw = u;
        if constexpr (!kVnni) {
          ws = _mm256_xor_si256(u, flip);
          aw = _mm256_abs_epi8(ws);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) DotInt8<kVnni>(acc[i][2 * j + h], u, ws, aw, b[i], ones16);
      }
    }
  }
  Acc sums[MR][2 * NT];
  CopyAccs(acc, sums);
  StoreInt8<kVnni, MR, NT>(sums, in, m0, wt, t0, n0, n1, bias, y, ldy);
}

// ---- int4 weights: per step of 8 elements the low nibbles hold elements 8p .. 8p + 3 and the
// high nibbles 8p + 4 .. 8p + 7; per group the int32 lanes hold its exact dot products, then
// one conversion and one FMA with the group's 8 scales of the half, and the zero correction
// zc = fma(s_g * z_g, A_g, zc) right after, while the group's trailer is in L1. (A second pass
// over the trailers after the tile, one half at a time, waited out the FMA latency of each
// group's correction: a lone row took 1.15-1.45x as long.) ----

// y for a finished int4 register tile from rz = r - zc: (rz * d) + bias, stored in the lanes that
// are columns in [n0, n1).
template <int MR, int NT>
__attribute__((noinline)) void StoreInt4(const __m256 (&rz)[MR][2 * NT], const I8Inputs& in,
                                         int64_t m0, int64_t t0, int64_t n0, int64_t n1,
                                         const float* bias, float* y, int64_t ldy) {
#pragma GCC unroll 8
  for (int j = 0; j < 2 * NT; ++j) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      StoreHalf(_mm256_mul_ps(rz[i][j], _mm256_set1_ps(in.scale[m0 + i])), 2 * t0 + j, n0, n1, bias,
                y + (m0 + i) * ldy);
    }
  }
}

// The steps of one group into the int32 sums dot (AVX-VNNI: vpdpbusd of the nibbles).
template <int MR, int NT, bool kPrefetch>
inline void Int4StepsVnni(const uint8_t* const (&q)[NT], int64_t at, int64_t steps,
                          const int8_t* const (&ag)[MR], int64_t tile_bytes,
                          Acc (&dot)[MR][2 * NT]) {
  const __m256i nib = _mm256_set1_epi8(15);
  for (int64_t p = 0; p < steps; ++p) {
    __m256i b0[MR], b1[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      b0[i] = Broadcast4(ag[i] + p * 8);
      b1[i] = Broadcast4(ag[i] + p * 8 + 4);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      if constexpr (kPrefetch) {
        TilePrefetch<MR>(q[j] + PrefetchOffset<MR, NT>(at + p * 64, tile_bytes));
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[j] + at + p * 64 + 32 * h));
        const __m256i lo = _mm256_and_si256(v, nib);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
#if defined(__AVXVNNI__)
          dot[i][2 * j + h] = _mm256_dpbusd_avx_epi32(dot[i][2 * j + h], lo, b0[i]);
          dot[i][2 * j + h] = _mm256_dpbusd_avx_epi32(dot[i][2 * j + h], hi, b1[i]);
#endif
        }
      }
    }
  }
}

// y[m0 .. m0+MR) x the columns in [n0, n1) of tiles t0 .. t0+NT, int4 weights, AVX-VNNI.
template <int MR, int NT, bool kPrefetch>
void TileInt4Vnni(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
                  int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t code_stride = in.chunks * in.chunk, G = in.groups, gs = wt.group_size;
  const int64_t tile_bytes = Int4TileBytes(in.K, gs);
  const uint8_t* q[NT];
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) q[j] = static_cast<const uint8_t*>(wt.data) + (t0 + j) * tile_bytes;
  __m256 r[MR][2 * NT], zc[MR][2 * NT];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < 2 * NT; ++j) r[i][j] = zc[i][j] = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g < G; ++g) {
    const int64_t at = Int4TileGroupStart(g, gs), steps = Int4TileGroupSteps(in.K, g, gs);
    const int64_t trailer = Int4TileGroupScales(in.K, g, gs);  // 16 scales, then 16 zeros
    const int8_t* ag[MR];                                      // the group's input codes
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) ag[i] = in.codes + (m0 + i) * code_stride + g * gs;
    if constexpr (kPrefetch) {
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        TilePrefetch<MR>(q[j] + PrefetchOffset<MR, NT>(trailer, tile_bytes));
        TilePrefetch<MR>(q[j] + PrefetchOffset<MR, NT>(trailer + 64, tile_bytes));
      }
    }
    Acc dot[MR][2 * NT];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < 2 * NT; ++j) dot[i][j] = _mm256_setzero_si256();
    }
    Int4StepsVnni<MR, NT, kPrefetch>(q, at, steps, ag, tile_bytes, dot);
    __m256 a[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) a[i] = _mm256_set1_ps(in.group_sums[(m0 + i) * G + g]);
#pragma GCC unroll 8
    for (int j = 0; j < 2 * NT; ++j) {
      const float* sp = reinterpret_cast<const float*>(q[j / 2] + trailer + 32 * (j % 2));
      const __m256 s = _mm256_loadu_ps(sp);
      const __m256 sz = _mm256_mul_ps(s, _mm256_loadu_ps(sp + 16));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        r[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][j]), s, r[i][j]);
        zc[i][j] = _mm256_fmadd_ps(sz, a[i], zc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < 2 * NT; ++j) r[i][j] = _mm256_sub_ps(r[i][j], zc[i][j]);
  }
  __m256 sums[MR][2 * NT];
  CopyAccs(r, sums);
  StoreInt4<MR, NT>(sums, in, m0, t0, n0, n1, bias, y, ldy);
}

// ---- int4 weights without VNNI (TileInt4Vnni's arithmetic). vpmaddubsw
// and vpmaddwd share one pipe, and vpaddw runs on three pipes that include it, so every add and
// every register copy or spill around the products takes time from them: only the int16 sums of
// a run of 4 steps live in registers (8 of them in the 4 x 1 tile), each run fully unrolled, and
// the int32 group sums (groups over 32), r and zc live in L1, read and written once per run or
// group. Row-major within a step: the four u8 operands of a tile's two halves, then per input
// row its two broadcasts against all four. ----

// The low-nibble mask, loaded from memory each step (Int4Mem): held in a register it pushed an
// int16 sum out to the stack.
alignas(32) constexpr uint8_t kLowNibbles[32] = {15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15,
                                                 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15,
                                                 15, 15, 15, 15, 15, 15, 15, 15, 15, 15};

// p, hidden from the optimizer: what is read or written through it stays in memory at that point
// (kept in registers across the loops, the L1 accumulators pushed int16 sums out instead).
template <class T>
inline T* Int4Mem(T* p) {
  asm volatile("" : "+r"(p));
  return p;
}

// One run of 4 steps at byte `at` of each tile of the register tile (tile 0 at `tile`), codes at
// a[i]: s[i][2j + h] = the int16 sums of the run's products of row i with half h of tile j.
template <int MR, int NT, bool kPrefetch>
inline void Int4Run(const uint8_t* tile, int64_t tile_bytes, int64_t at,
                    const int8_t* const (&a)[MR], Acc (&s)[MR][2 * NT]) {
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m256i nib = _mm256_load_si256(reinterpret_cast<const __m256i*>(Int4Mem(kLowNibbles)));
    __m256i lo[2 * NT], hi[2 * NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const uint8_t* step = tile + j * tile_bytes + at + p * 64;
      if constexpr (kPrefetch) {
        TilePrefetch<MR>(tile + j * tile_bytes + PrefetchOffset<MR, NT>(at + p * 64, tile_bytes));
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(step + 32 * h));
        lo[2 * j + h] = _mm256_and_si256(v, nib);
        hi[2 * j + h] = _mm256_srli_epi16(_mm256_andnot_si256(nib, v), 4);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256i b0 = Broadcast4(a[i] + p * 8), b1 = Broadcast4(a[i] + p * 8 + 4);
#pragma GCC unroll 8
      for (int jh = 0; jh < 2 * NT; ++jh) {
        const __m256i x =
            _mm256_add_epi16(_mm256_maddubs_epi16(lo[jh], b0), _mm256_maddubs_epi16(hi[jh], b1));
        s[i][jh] = p == 0 ? x : _mm256_add_epi16(s[i][jh], x);
        // The sum in a register after each step: integer adds reassociate, and GCC computed all
        // 32 products of a run before the first sum, spilling them.
        asm("" : "+x"(s[i][jh]));
      }
    }
  }
}

// y[m0 .. m0+MR) x the columns in [n0, n1) of tiles t0 .. t0+NT, int4 weights, without VNNI.
template <int MR, int NT, bool kPrefetch>
void TileInt4Runs(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
                  int64_t n1, const float* bias, float* y, int64_t ldy) {
  constexpr int NH = 2 * NT;
  const int64_t code_stride = in.chunks * in.chunk, G = in.groups, gs = wt.group_size;
  const int64_t tile_bytes = Int4TileBytes(in.K, gs), group_bytes = Int4TileGroupStart(1, gs);
  // Runs of 4 steps per group: gs / 32, fewer in a last group cut short by K.
  const int64_t runs_full = gs / 32, runs_last = Int4TileGroupSteps(in.K, G - 1, gs) / 4;
  const uint8_t* tile = static_cast<const uint8_t*>(wt.data) + t0 * tile_bytes;
  const int8_t* codes = in.codes + m0 * code_stride;
  const float* sums = in.group_sums + m0 * G;
  const __m256i ones16 = _mm256_set1_epi16(1);
  alignas(32) int32_t dot_mem[MR][NH][8];
  alignas(32) float r_mem[MR][NH][8], zc_mem[MR][NH][8];
  std::memset(r_mem, 0, sizeof(r_mem));
  std::memset(zc_mem, 0, sizeof(zc_mem));
  int64_t at = 0;  // the group's first step in each tile
  for (int64_t g = 0; g < G; ++g, at += group_bytes, codes += gs) {
    const int64_t runs = g + 1 < G ? runs_full : runs_last;
    const int64_t trailer = at + 256 * runs;  // 16 scales, then 16 zeros
    if constexpr (kPrefetch) {
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        TilePrefetch<MR>(tile + j * tile_bytes + PrefetchOffset<MR, NT>(trailer, tile_bytes));
        TilePrefetch<MR>(tile + j * tile_bytes + PrefetchOffset<MR, NT>(trailer + 64, tile_bytes));
      }
    }
    const int8_t* a[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) a[i] = codes + i * code_stride;
    Acc s[MR][NH];
    for (int64_t run = 0; run + 1 < runs; ++run) {
      Int4Run<MR, NT, kPrefetch>(tile, tile_bytes, at + 256 * run, a, s);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) a[i] += 32;
      int32_t* dm = &Int4Mem(dot_mem)[0][0][0];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
        for (int jh = 0; jh < NH; ++jh) {
          __m256i* d = reinterpret_cast<__m256i*>(dm + (i * NH + jh) * 8);
          const __m256i x = _mm256_madd_epi16(s[i][jh], ones16);
          _mm256_store_si256(d, run == 0 ? x : _mm256_add_epi32(_mm256_load_si256(d), x));
        }
      }
    }
    Int4Run<MR, NT, kPrefetch>(tile, tile_bytes, trailer - 256, a, s);
    // The group's dot products, then r and zc as TileInt4Vnni.
    __m256 ag[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) ag[i] = _mm256_set1_ps(sums[i * G + g]);
    const int32_t* dm = &Int4Mem(dot_mem)[0][0][0];
    float* rm = &Int4Mem(r_mem)[0][0][0];
    float* zm = &Int4Mem(zc_mem)[0][0][0];
#pragma GCC unroll 8
    for (int jh = 0; jh < NH; ++jh) {
      const float* sp =
          reinterpret_cast<const float*>(tile + (jh / 2) * tile_bytes + trailer) + 8 * (jh % 2);
      const __m256 sc = _mm256_loadu_ps(sp);
      const __m256 sz = _mm256_mul_ps(sc, _mm256_loadu_ps(sp + 16));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const int64_t o = (i * NH + jh) * 8;
        __m256i dot = _mm256_madd_epi16(s[i][jh], ones16);
        if (runs > 1) {
          dot = _mm256_add_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(dm + o)), dot);
        }
        _mm256_store_ps(rm + o,
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, _mm256_load_ps(rm + o)));
        _mm256_store_ps(zm + o, _mm256_fmadd_ps(sz, ag[i], _mm256_load_ps(zm + o)));
      }
    }
  }
  __m256 rz[MR][NH];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int jh = 0; jh < NH; ++jh) {
      rz[i][jh] = _mm256_sub_ps(_mm256_load_ps(r_mem[i][jh]), _mm256_load_ps(zc_mem[i][jh]));
    }
  }
  StoreInt4<MR, NT>(rz, in, m0, t0, n0, n1, bias, y, ldy);
}

template <bool kVnni, WeightQuant Q, int MR, int NT, bool kPrefetch>
void Tile256(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t t0, int64_t n0,
             int64_t n1, const float* bias, float* y, int64_t ldy) {
  if constexpr (Q == WeightQuant::kInt4 && !kVnni) {
    TileInt4Runs<MR, NT, kPrefetch>(in, m0, wt, t0, n0, n1, bias, y, ldy);
  } else if constexpr (Q == WeightQuant::kInt4) {
    TileInt4Vnni<MR, NT, kPrefetch>(in, m0, wt, t0, n0, n1, bias, y, ldy);
  } else {
    TileInt8<kVnni, MR, NT, kPrefetch>(in, m0, wt, t0, n0, n1, bias, y, ldy);
  }
}

using Tile256Fn = void (*)(const I8Inputs&, int64_t, const MatMulWeight&, int64_t, int64_t, int64_t,
                           const float*, float*, int64_t);

template <bool kVnni, WeightQuant Q, int NT, bool kPrefetch, int... I>
constexpr Tile256Fn kTiles256[] = {&Tile256<kVnni, Q, I / NT + 1, I % NT + 1, kPrefetch>...};

template <bool kVnni, WeightQuant Q, int NT, bool kPrefetch, int... I>
constexpr const Tile256Fn* Tiles256Of(std::integer_sequence<int, I...>) {
  return kTiles256<kVnni, Q, NT, kPrefetch, I...>;
}

// Columns [n0, n1) over register tiles of kMR x kNT, as the 512-bit kernel's Range: a lone row
// runs its kNT1-tile register tiles front to back; a decode batch of two row tiles takes both
// over each register tile of weights in turn; otherwise L2 blocks of tiles, each passed over by
// every row tile (the first prefetching).
template <bool kVnni, WeightQuant Q, int kMR, int kNT>
void Range256(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias,
              float* y, int64_t ldy) {
  const int64_t M = in.M;
  using S = Shapes256<kVnni, Q>;
  const Tile256Fn* first =
      Tiles256Of<kVnni, Q, kNT, true>(std::make_integer_sequence<int, kMR * kNT>());
  const Tile256Fn* rest =
      M <= 2 * kMR ? first
                   : Tiles256Of<kVnni, Q, kNT, false>(std::make_integer_sequence<int, kMR * kNT>());
  const int64_t t_begin = n0 / 16, t_end = (n1 + 15) / 16;
  if (M == 1) {
    constexpr int kNT1 = S::kNT1;
    const Tile256Fn* lone =
        Tiles256Of<kVnni, Q, kNT1, S::kLonePrefetch>(std::make_integer_sequence<int, kNT1>());
    for (int64_t t = t_begin; t < t_end; t += kNT1) {
      const int nt = static_cast<int>(t_end - t < kNT1 ? t_end - t : kNT1);
      lone[nt - 1](in, 0, w, t, n0, n1, bias, y, ldy);
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
  const int64_t tile_bytes = S::TileBytes(in.K, w.group_size);
  int64_t block = tile_bytes > 0 ? kTileBlockBytes / tile_bytes / kNT * kNT : kNT;
  if (block < kNT) block = kNT;
  for (int64_t b0 = t_begin; b0 < t_end; b0 += block) {
    const int64_t b1 = b0 + block < t_end ? b0 + block : t_end;
    for (int64_t m = 0; m < M; m += kMR) {
      const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
      const Tile256Fn* tiles = m == 0 ? first : rest;
      for (int64_t t = b0; t < b1; t += kNT) {
        const int nt = static_cast<int>(b1 - t < kNT ? b1 - t : kNT);
        tiles[(mr - 1) * kNT + (nt - 1)](in, m, w, t, n0, n1, bias, y, ldy);
      }
    }
  }
}

template <bool kVnni, WeightQuant Q>
void RangeOf256(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                const float* bias, float* y, int64_t ldy) {
  using S = Shapes256<kVnni, Q>;
  if (in.M <= S::kSmallM) {
    Range256<kVnni, Q, S::kSmallMR, S::kSmallNT>(in, w, n0, n1, bias, y, ldy);
  } else {
    Range256<kVnni, Q, S::kMR, S::kNT>(in, w, n0, n1, bias, y, ldy);
  }
}

template <bool kVnni>
void MatMulI8Tiles256(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                      const float* bias, float* y, int64_t ldy) {
  if (in.quant == WeightQuant::kInt4) {
    RangeOf256<kVnni, WeightQuant::kInt4>(in, w, n0, n1, bias, y, ldy);
  } else {
    RangeOf256<kVnni, WeightQuant::kInt8>(in, w, n0, n1, bias, y, ldy);
  }
}

}  // namespace
}  // namespace tandem::cpu::internal
