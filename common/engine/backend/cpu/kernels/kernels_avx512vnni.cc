// MatMul with int8 inputs on AVX512_VNNI (vpdpbusd) over int8 or int4 weights: the arithmetic
// int8_inputs.h specifies and MatMulI8Reference spells out, bit for bit. Compiled with this
// ISA's flags only (see CMakeLists.txt); the dispatcher calls it only when the CPU has
// AVX512_VNNI. Also the input quantizer's row function, equal to QuantizeRowI8Reference bit for
// bit. Everything here has internal linkage except MatMulI8Avx512Vnni and QuantizeRowI8Avx512
// (README.md, "ODR").

#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/engine/backend/cpu/kernels/int8_inputs.h"

namespace tandem::cpu::internal {
namespace {

constexpr int64_t kPrefetchBytes = 1024;
constexpr int64_t kInt4PrefetchBytes = 16384;

// Where weight row j of a tile of NR rows (row_bytes apart) is prefetched while chunk c is read:
// kPrefetchBytes ahead in the same row, or, past the row's end, in the next tile's row j (the
// rows of consecutive tiles are consecutive in memory), so a tile starts with its lines on the way.
template <int NR>
inline int64_t PrefetchOffset(int64_t c, int64_t row_bytes) {
  const int64_t ahead = c * 64 + kPrefetchBytes;
  return ahead < row_bytes ? ahead : ahead + (NR - 1) * row_bytes;
}

constexpr int64_t kBlockBytes = 256 * 1024;

inline __mmask64 ByteMask(int64_t n) {
  return n >= 64 ? ~__mmask64{0} : static_cast<__mmask64>((uint64_t{1} << n) - 1);
}

// int8 weights: 64 codes per chunk; see TileInt8.
struct Int8Fmt {
  static constexpr int kMR = 4, kNR = 6;  // register tile: 24 int32 accumulators
  static constexpr int kNR1 = 8;          // weight rows per tile for a lone input row
  static int64_t RowBytes(int64_t K) { return K; }
};

// int4 weights: 128 codes per 64-byte chunk (low nibbles, then high nibbles per 16 bytes, which
// is how the inputs are interleaved); see TileInt4.
struct Int4Fmt {
  static constexpr int kMR = 4, kNR = 3;  // register tile: 12 f32 + 12 int32 accumulators
  static constexpr int kNR1 = 4;          // weight rows per tile for a lone input row
  static int64_t RowBytes(int64_t K) { return Int4RowBytes(K); }
};

// int4 weights in groups of 128: one group per chunk, so each chunk's int32 lanes go straight
// into the f32 accumulators (no int32 accumulators live across chunks); see TileInt4G128.
struct Int4G128Fmt {
  static constexpr int kMR = 4, kNR = 4;  // register tile: 16 f32 accumulators
  static constexpr int kNR1 = 8;          // a lone input row: eight weight streams (1.2-1.4x four)
  static int64_t RowBytes(int64_t K) { return Int4RowBytes(K); }
};

// The 128 int4 codes of one 64-byte chunk of a weight row (bytes under `mask`): low nibbles
// and high nibbles, each byte a u8 operand for vpdpbusd against the interleaved inputs.
inline void LoadNibbles(const uint8_t* p, __mmask64 mask, __m512i* lo, __m512i* hi) {
  const __m512i nib = _mm512_set1_epi8(15);
  const __m512i v = _mm512_maskz_loadu_epi8(mask, p);
  *lo = _mm512_and_si512(v, nib);
  *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
}

// Tiles hand their out-of-line epilogue a copy of the accumulators: given the accumulators
// themselves (their address escapes), GCC keeps them in memory through the tile's loop, one
// store per accumulator and chunk (the int4 tiles did: 1.05-1.25x slower).
template <class V, int MR, int NR>
inline void CopyAccumulators(const V (&from)[MR][NR], V (&to)[MR][NR]) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) to[i][j] = from[i][j];
  }
}

// [sum of a's lanes, b's, c's, d's] (int32, wrapping like any order of the same adds).
inline __m128i Reduce4(__m512i a, __m512i b, __m512i c, __m512i d) {
  // Per 128-bit lane: ab = [a0+a2, b0+b2, a1+a3, b1+b3], cd likewise, then [a, b, c, d].
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i v = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// y for a finished int8 tile, four outputs at a time: integer sums (exact in any order), then per
// output ((float(dot - offset) * d) * s) + bias, the same IEEE operations as one at a time.
template <int MR, int NR, bool kBiased>
__attribute__((noinline)) void StoreInt8(const __m512i (&acc)[MR][NR], const I8Inputs& in,
                                         int64_t m0, const MatMulWeight& wt, int64_t n0,
                                         const float* bias, float* y, int64_t ldy) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m128 d = _mm_set1_ps(in.scale[m0 + i]);
    constexpr int kPadded = (NR + 3) / 4 * 4;
    __m512i r[kPadded];
#pragma GCC unroll 8
    for (int j = 0; j < kPadded; ++j) r[j] = j < NR ? acc[i][j] : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < NR; j += 4) {
      const int n = NR - j < 4 ? NR - j : 4;
      const __mmask8 m = static_cast<__mmask8>((1 << n) - 1);
      const __m128i sums = Reduce4(r[j], r[j + 1], r[j + 2], r[j + 3]);
      const __m128i offset =
          kBiased ? _mm_slli_epi32(_mm_cvttps_epi32(_mm_maskz_loadu_ps(m, wt.row_sums + n0 + j)), 7)
                  : _mm_set1_epi32(128 * in.sum[m0 + i]);
      __m128 out = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(sums, offset)), d),
                              _mm_maskz_loadu_ps(m, wt.scales + n0 + j));
      if (bias != nullptr) out = _mm_add_ps(out, _mm_maskz_loadu_ps(m, bias + n0 + j));
      _mm_mask_storeu_ps(y + (m0 + i) * ldy + n0 + j, m, out);
    }
  }
}

// y[m0 .. m0+MR) x [n0 .. n0+NR), int8 weights; the int32 lanes run over the whole row (exact:
// K <= 65536). kBiased (the weights carry row sums): the inputs, stored as a + 128, are the
// unsigned operand of vpdpbusd and the weights enter as they are; 128 * row sum comes off at the
// end. Otherwise the weights enter as w + 128 (one xor) and 128 * sum(a) comes off.
template <int MR, int NR, bool kPrefetch, bool kBiased>
void TileInt8(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t n0, const float* bias,
              float* y, int64_t ldy) {
  const int64_t K = in.K, code_stride = in.chunks * in.chunk;
  const int8_t* rows[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) rows[j] = static_cast<const int8_t*>(wt.data) + (n0 + j) * K;
  __m512i acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t full = K / 64;
  for (int64_t c = 0; c < in.chunks; ++c) {
    const __mmask64 mask = c < full ? ~__mmask64{0} : ByteMask(K - c * 64);
    const int64_t pf = kPrefetch ? PrefetchOffset<NR>(c, K) : 0;
    __m512i a[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      a[i] = _mm512_loadu_si512(in.codes + (m0 + i) * code_stride + c * 64);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[j] + pf), _MM_HINT_T0);
      }
      const __m512i w = _mm512_maskz_loadu_epi8(mask, rows[j] + c * 64);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        if constexpr (kBiased) {
          acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], a[i], w);
        } else {
          acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], _mm512_xor_si512(w, flip), a[i]);
        }
      }
    }
  }
  __m512i sums[MR][NR];
  CopyAccumulators(acc, sums);
  StoreInt8<MR, NR, kBiased>(sums, in, m0, wt, n0, bias, y, ldy);
}

// [reduce_add(a), reduce_add(b), reduce_add(c), reduce_add(d)] with _mm512_reduce_add_ps's tree
// for each (halves, then quarters, then (0 + 2) + (1 + 3)), four at once.
inline __m128 Reduce4Ps(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 256-bit halves: [a.lo + a.hi, b.lo + b.hi] and likewise c, d.
  const __m512 ab =
      _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd =
      _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // 128-bit quarters: lane q holds vector q's t6 = [t3[0] + t3[4], ..].
  const __m512 t6 =
      _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  // Per lane: [t6_0 + t6_2, t6_1 + t6_3, ..], then element 0 = (t6_0 + t6_2) + (t6_1 + t6_3).
  const __m512 p = _mm512_add_ps(t6, _mm512_permute_ps(t6, 0x4E));
  const __m512 r = _mm512_add_ps(p, _mm512_permute_ps(p, 0xB1));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), r));
}

// y for a finished int4 tile, four outputs at a time: ((reduce_add(acc) - zc) * d) + bias, where
// the zero points' term zc of row n reduces over groups of fma(s_g * z_g, A_g, .) (A = the input
// row's group code sums) in 16 lanes, g % 16. Out of line, so the
// tile's accumulators stay in registers through its loop.
template <int MR, int NR>
__attribute__((noinline)) void StoreInt4(const __m512 (&acc)[MR][NR], const I8Inputs& in,
                                         int64_t m0, const MatMulWeight& wt, int64_t n0,
                                         const float* bias, float* y, int64_t ldy) {
  const int64_t G = in.groups;
  constexpr int kPadded = (NR + 3) / 4 * 4;
  // Zero point terms of the tile: zacc[i][j] lanes g % 16 of fma(s_g * z_g, A_g, .).
  __m512 zacc[MR][kPadded];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kPadded; ++j) zacc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < G; g += 16) {
    const __mmask16 m = G - g >= 16 ? 0xFFFF : static_cast<__mmask16>((1 << (G - g)) - 1);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const float* s = wt.scales + (n0 + j) * G + g;
      const float* z = wt.zeros + (n0 + j) * G + g;
      const __m512 sz = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s), _mm512_maskz_loadu_ps(m, z));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 A = _mm512_maskz_loadu_ps(m, in.group_sums + (m0 + i) * G + g);
        zacc[i][j] = _mm512_fmadd_ps(sz, A, zacc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m128 d = _mm_set1_ps(in.scale[m0 + i]);
    __m512 r[kPadded];
#pragma GCC unroll 8
    for (int j = 0; j < kPadded; ++j) r[j] = j < NR ? acc[i][j] : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < NR; j += 4) {
      const int n = NR - j < 4 ? NR - j : 4;
      const __mmask8 m = static_cast<__mmask8>((1 << n) - 1);
      const __m128 dot = Reduce4Ps(r[j], r[j + 1], r[j + 2], r[j + 3]);
      const __m128 zc = Reduce4Ps(zacc[i][j], zacc[i][j + 1], zacc[i][j + 2], zacc[i][j + 3]);
      __m128 out = _mm_mul_ps(_mm_sub_ps(dot, zc), d);
      if (bias != nullptr) out = _mm_add_ps(out, _mm_maskz_loadu_ps(m, bias + n0 + j));
      _mm_mask_storeu_ps(y + (m0 + i) * ldy + n0 + j, m, out);
    }
  }
}

// y[m0 .. m0+MR) x [n0 .. n0+NR), int4 weights. kWide: groups of 128 or more (one scale per
// chunk, broadcast); else 32 or 64 (per-lane scales gathered by a permute).
template <int MR, int NR, bool kPrefetch, bool kWide>
void TileInt4(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t n0, const float* bias,
              float* y, int64_t ldy) {
  const int64_t K = in.K, code_stride = in.chunks * in.chunk, G = in.groups;
  const int64_t row_bytes = Int4RowBytes(K);
  int shift = 0;
  while ((int64_t{1} << shift) < wt.group_size) ++shift;
  const uint8_t* q[NR];
  const float* sc[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) {
    q[j] = static_cast<const uint8_t*>(wt.data) + (n0 + j) * row_bytes;
    sc[j] = wt.scales + (n0 + j) * G;
  }
  __m512 acc[MR][NR];
  __m512i lanes[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      acc[i][j] = _mm512_setzero_ps();
      lanes[i][j] = _mm512_setzero_si512();
    }
  }
  // Lane l of a chunk is block l/4; its group within the chunk's first group, for narrow groups.
  const __m512i idx = _mm512_srli_epi32(
      _mm512_setr_epi32(0, 0, 0, 0, 32, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 96),
      kWide ? 7 : shift);
  const int64_t full = row_bytes / 64;  // chunks whose 64 weight bytes lie inside the row
  const int64_t period = kWide ? wt.group_size / 128 : 1;
  int64_t countdown = period;
  for (int64_t c = 0; c < in.chunks; ++c) {
    const __mmask64 mask = c < full ? ~__mmask64{0} : ByteMask(row_bytes - c * 64);
    const bool flush = --countdown == 0 || c + 1 == in.chunks;
    if (countdown == 0) countdown = period;
    const int64_t base = (c * 128) >> shift;  // the chunk's first group
    const __mmask16 smask =
        G - base >= 4 ? __mmask16{0xF} : static_cast<__mmask16>((1 << (G - base)) - 1);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(q[j] + c * 64) + kInt4PrefetchBytes,
                     _MM_HINT_T0);
      }
      __m512i lo, hi;
      LoadNibbles(q[j] + c * 64, mask, &lo, &hi);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const int8_t* a = in.codes + (m0 + i) * code_stride + c * 128;
        lanes[i][j] = _mm512_dpbusd_epi32(lanes[i][j], lo, _mm512_loadu_si512(a));
        lanes[i][j] = _mm512_dpbusd_epi32(lanes[i][j], hi, _mm512_loadu_si512(a + 64));
      }
      if (flush) {
        __m512 sv;
        if constexpr (kWide) {
          sv = _mm512_set1_ps(sc[j][base]);
        } else {
          sv = _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(smask, sc[j] + base));
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes[i][j]), sv, acc[i][j]);
          lanes[i][j] = _mm512_setzero_si512();
        }
      }
    }
  }
  __m512 sums[MR][NR];
  CopyAccumulators(acc, sums);
  StoreInt4<MR, NR>(sums, in, m0, wt, n0, bias, y, ldy);
}

// y[m0 .. m0+MR) x [n0 .. n0+NR), int4 weights in groups of 128: TileInt4 with kWide and a flush
// after every chunk (the same operations in the same order), the int32 lanes a temporary.
template <int MR, int NR, bool kPrefetch>
void TileInt4G128(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t n0,
                  const float* bias, float* y, int64_t ldy) {
  const int64_t code_stride = in.chunks * in.chunk, G = in.groups;
  const int64_t row_bytes = Int4RowBytes(in.K);
  const uint8_t* q[NR];
  const float* sc[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) {
    q[j] = static_cast<const uint8_t*>(wt.data) + (n0 + j) * row_bytes;
    sc[j] = wt.scales + (n0 + j) * G;
  }
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const int64_t full = row_bytes / 64;
  for (int64_t c = 0; c < in.chunks; ++c) {
    const __mmask64 mask = c < full ? ~__mmask64{0} : ByteMask(row_bytes - c * 64);
    __m512i a0[MR], a1[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const int8_t* a = in.codes + (m0 + i) * code_stride + c * 128;
      a0[i] = _mm512_loadu_si512(a);
      a1[i] = _mm512_loadu_si512(a + 64);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(q[j] + c * 64) + kInt4PrefetchBytes,
                     _MM_HINT_T0);
      }
      __m512i lo, hi;
      LoadNibbles(q[j] + c * 64, mask, &lo, &hi);
      const __m512 sv = _mm512_set1_ps(sc[j][c]);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, a0[i]);
        acc[i][j] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(t, hi, a1[i])), sv, acc[i][j]);
      }
    }
  }
  __m512 sums[MR][NR];
  CopyAccumulators(acc, sums);
  StoreInt4<MR, NR>(sums, in, m0, wt, n0, bias, y, ldy);
}

template <int MR, int NR, bool kPrefetch, class Fmt>
void Tile(const I8Inputs& in, int64_t m0, const MatMulWeight& wt, int64_t n0, const float* bias,
          float* y, int64_t ldy) {
  if constexpr (std::is_same_v<Fmt, Int8Fmt>) {
    if (in.biased) {
      TileInt8<MR, NR, kPrefetch, true>(in, m0, wt, n0, bias, y, ldy);
    } else {
      TileInt8<MR, NR, kPrefetch, false>(in, m0, wt, n0, bias, y, ldy);
    }
  } else if constexpr (std::is_same_v<Fmt, Int4G128Fmt>) {
    TileInt4G128<MR, NR, kPrefetch>(in, m0, wt, n0, bias, y, ldy);
  } else if (wt.group_size >= 128) {
    TileInt4<MR, NR, kPrefetch, true>(in, m0, wt, n0, bias, y, ldy);
  } else {
    TileInt4<MR, NR, kPrefetch, false>(in, m0, wt, n0, bias, y, ldy);
  }
}

using TileFn = void (*)(const I8Inputs&, int64_t, const MatMulWeight&, int64_t, const float*,
                        float*, int64_t);

template <bool kPrefetch, class Fmt, int... I>
constexpr TileFn kTiles[] = {&Tile<I / Fmt::kNR + 1, I % Fmt::kNR + 1, kPrefetch, Fmt>...};

template <bool kPrefetch, class Fmt, int... I>
constexpr const TileFn* TilesOf(std::integer_sequence<int, I...>) {
  return kTiles<kPrefetch, Fmt, I...>;
}

// Columns [n0, n1) in blocks of weight rows that stay in L2 while every row tile passes over them.
template <class Fmt>
void Range(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias,
           float* y, int64_t ldy) {
  constexpr int kMR = Fmt::kMR, kNR = Fmt::kNR, kNR1 = Fmt::kNR1;
  const int64_t M = in.M;
  // The first row tile of a block brings its weights in from memory: prefetched. The others
  // find them in L2, where prefetching only costs, unless there are few rows.
  const TileFn* first = TilesOf<true, Fmt>(std::make_integer_sequence<int, kMR * kNR>());
  const TileFn* rest =
      M <= 2 * kMR ? first : TilesOf<false, Fmt>(std::make_integer_sequence<int, kMR * kNR>());
  const int64_t row_bytes = Fmt::RowBytes(in.K);
  if (!std::is_same_v<Fmt, Int8Fmt> && M > kMR && M <= 2 * kMR) {
    // int4, a decode batch of two row tiles: both over each group of weight rows in turn, the
    // second from L1, while the prefetches of both keep the next rows streaming in. (Block by
    // block, the memory would idle while the second row tile ran from L2: 1.1-1.3x slower at
    // M = 8. int8 weights measured the other way round, so they keep the blocks.)
    for (int64_t n = n0; n < n1; n += kNR) {
      const int nr = static_cast<int>(n1 - n < kNR ? n1 - n : kNR);
      for (int64_t m = 0; m < M; m += kMR) {
        const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
        first[(mr - 1) * kNR + (nr - 1)](in, m, w, n, bias, y, ldy);
      }
    }
    return;
  }
  int64_t block = row_bytes > 0 ? kBlockBytes / row_bytes / kNR * kNR : kNR;
  if (block < kNR) block = kNR;
  for (int64_t b0 = n0; b0 < n1; b0 += block) {
    const int64_t b1 = b0 + block < n1 ? b0 + block : n1;
    for (int64_t m = 0; m < M; m += kMR) {
      const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
      int64_t n = b0;
      if (mr == 1) {
        for (; n + kNR1 <= b1; n += kNR1) Tile<1, kNR1, true, Fmt>(in, m, w, n, bias, y, ldy);
      }
      const TileFn* tiles = m == 0 ? first : rest;
      for (; n < b1; n += kNR) {
        const int nr = static_cast<int>(b1 - n < kNR ? b1 - n : kNR);
        tiles[(mr - 1) * kNR + (nr - 1)](in, m, w, n, bias, y, ldy);
      }
    }
  }
}

}  // namespace

void MatMulI8Avx512Vnni(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                        const float* bias, float* y, int64_t ldy) {
  if (in.quant == WeightQuant::kInt4 && w.group_size == 128) {
    Range<Int4G128Fmt>(in, w, n0, n1, bias, y, ldy);
  } else if (in.quant == WeightQuant::kInt4) {
    Range<Int4Fmt>(in, w, n0, n1, bias, y, ldy);
  } else {
    Range<Int8Fmt>(in, w, n0, n1, bias, y, ldy);
  }
}

void QuantizeRowI8Avx512(const float* x, int64_t K, bool int4, int64_t group_size, int32_t offset,
                         int8_t* codes, float* scale, int32_t* sum, float* group_sums) {
  *sum = 0;
  const int64_t kmain = K - K % 16;
  const auto tail = static_cast<__mmask16>((1u << (K - kmain)) - 1);
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;  // lanes that saw a NaN or an infinity (not <= FLT_MAX)
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 a =
        _mm512_abs_ps(k < kmain ? _mm512_loadu_ps(x + k) : _mm512_maskz_loadu_ps(tail, x + k));
    bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ);
    vmax = _mm512_max_ps(vmax, a);  // exact whatever the order once every element is finite
  }
  float inv = 0.0f;
  if (!QuantizeRowI8Scale(_mm512_reduce_max_ps(vmax), bad == 0, scale, &inv)) return;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  const __m128i flip = _mm_set1_epi8(static_cast<char>(offset));  // + 128 == xor 0x80 on codes
  __m512i total = _mm512_setzero_si512(), group = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = k < kmain ? __mmask16{0xFFFF} : tail;
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), vinv);
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(v, hi), lo));
    total = _mm512_add_epi32(total, q);
    const __m128i b = _mm_xor_si128(_mm512_cvtepi32_epi8(q), flip);
    if (int4) {
      // 16 elements [32c + 16h, + 16) of a chunk of 128 sit at bytes 64h + 16c of its codes.
      const int64_t r = k % 128;
      _mm_mask_storeu_epi8(codes + (k - r) + (r % 32 >= 16 ? 64 : 0) + 16 * (r / 32), m, b);
      group = _mm512_add_epi32(group, q);
      if ((k + 16) % group_size == 0 || k + 16 >= K) {  // a group holds whole 16s (>= 32)
        group_sums[k / group_size] = static_cast<float>(_mm512_reduce_add_epi32(group));
        group = _mm512_setzero_si512();
      }
    } else {
      _mm_mask_storeu_epi8(codes + k, m, b);
    }
  }
  *sum = _mm512_reduce_add_epi32(total);
}

}  // namespace tandem::cpu::internal
