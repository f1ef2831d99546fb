// MatMul with bf16 inputs on AVX512_BF16 (vdpbf16ps: 32 bf16 products per instruction, summed
// pairwise into 16 f32 lanes), over dense bf16 weights, int8 codes (exact in bf16; the row scale
// multiplies the finished dot product) or int4 weights as bf16((q - z) * s), nearest even.
// Compiled with this ISA's flags only (see CMakeLists.txt); the dispatcher calls it only when the
// CPU has AVX512_BF16. Everything here has internal linkage except MatMulBf16Avx512 (see README.md,
// "ODR").
//
// Arithmetic of every output y[m, n] (its batch-invariance rule): one accumulator of 16 f32 lanes
// starts at +0; for k = 0, 32, 64, ... while k + 32 <= K: acc = vdpbf16ps(acc, x[k:k+32],
// w[k:k+32]); then, if K % 32 != 0, one more with both tails zero-padded (masked loads); then
// _mm512_reduce_add_ps (one fixed tree), then (int8) * scale[n], then + bias[n]. Tiles only choose
// which outputs are computed together.

#include <immintrin.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/engine/backend/cpu/kernels/kernels_internal.h"

namespace tandem::cpu::internal {
namespace {

constexpr int kMR = 4;   // activation rows per register tile fused with dequantization
constexpr int kNR = 6;   // weight blocks hold a multiple of this many rows (see Wide, Tall)
constexpr int kNR1 = 8;  // weight rows per tile for a lone activation row
// Up to this many activation rows every row tile prefetches its weights (decode batches), and
// the tiles are Wide; beyond it only the first row tile of a block does, and they are Tall.
constexpr int64_t kPrefetchAllRows = 8;
constexpr int64_t kPrefetchBytes = 1024;
constexpr int64_t kBlockBytes = 256 * 1024;

inline __m512bh Bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// Weight row formats: MakeRow(w, n, K) is a handle on row n; Load(row, k) the 32 bf16 weights
// [k, k + 32) (k a multiple of 32), LoadTail(row, k, mask) those under `mask` with the others +0;
// Addr(row, k) where element k's bytes are (for prefetch). Quantized rows are dequantized in
// registers to bf16(f32 value) (the f32 value as in quant.h: one exact product), rounded to
// nearest even, so the fused tiles and a block dequantized to memory use the same weights.
struct Bf16Fmt {
  using Row = const uint16_t*;
  static Row MakeRow(const MatMulWeight& w, int64_t n, int64_t K) {
    return static_cast<const uint16_t*>(w.data) + n * K;
  }
  static __m512bh Load(Row r, int64_t k) { return Bh(_mm512_loadu_si512(r + k)); }
  static __m512bh LoadTail(Row r, int64_t k, __mmask32 m) {
    return Bh(_mm512_maskz_loadu_epi16(m, r + k));
  }
  static const char* Addr(Row r, int64_t k) { return reinterpret_cast<const char*>(r + k); }
  static int64_t RowBytes(int64_t K) { return 2 * K; }
};

// int8: the codes themselves, exact in bf16; the row's scale multiplies the finished dot product
// (see Tile's `scales`).
struct Int8Fmt {
  using Row = const int8_t*;
  static Row MakeRow(const MatMulWeight& w, int64_t n, int64_t K) {
    return static_cast<const int8_t*>(w.data) + n * K;
  }
  static __m512bh Widen(__m128i lo, __m128i hi) {
    return _mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)),
                               _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)));
  }
  static __m512bh Load(Row r, int64_t k) {
    return Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + k)),
                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + k + 16)));
  }
  static __m512bh LoadTail(Row r, int64_t k, __mmask32 m) {
    const __m256i q = _mm256_maskz_loadu_epi8(m, r + k);  // masked-off codes are 0
    return Widen(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  }
  static const char* Addr(Row r, int64_t k) { return reinterpret_cast<const char*>(r + k); }
  static int64_t RowBytes(int64_t K) { return K; }
};

struct Int4Fmt {
  using Row = Int4Row;
  static Row MakeRow(const MatMulWeight& w, int64_t n, int64_t K) { return MakeInt4Row(w, n, K); }
  // Rows are padded to whole 16-byte chunks, so the full load stays inside the row.
  static __m512bh Load(const Row& r, int64_t k) {
    const int64_t g = k >> r.shift;
    const __m512 z = _mm512_set1_ps(r.z[g]), s = _mm512_set1_ps(r.s[g]);
    const __m512i v =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.q + k / 2)));
    const __m512 lo = _mm512_mul_ps(
        _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))), z), s);
    const __m512 hi =
        _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), z), s);
    return _mm512_cvtne2ps_pbh(hi, lo);
  }
  static __m512bh LoadTail(const Row& r, int64_t k, __mmask32 m) {
    return Bh(_mm512_maskz_mov_epi16(m, reinterpret_cast<__m512i>(Load(r, k))));
  }
  static const char* Addr(const Row& r, int64_t k) {
    return reinterpret_cast<const char*>(r.q + k / 2);
  }
  static int64_t RowBytes(int64_t K) { return (K + 31) / 32 * 16; }
};

inline __mmask32 TailMask(int64_t n) { return static_cast<__mmask32>((uint64_t{1} << n) - 1); }

// Rows [n0, n1) of a quantized weight as bf16 (K elements per row) from `out`: the values the
// fused tiles load.
template <class Fmt>
void DequantRows(const MatMulWeight& w, int64_t K, int64_t n0, int64_t n1, uint16_t* out) {
  const int64_t kmain = K - K % 32;
  for (int64_t n = n0; n < n1; ++n) {
    const typename Fmt::Row row = Fmt::MakeRow(w, n, K);
    uint16_t* o = out + (n - n0) * K;
    for (int64_t k = 0; k < kmain; k += 32) {
      _mm_prefetch(Fmt::Addr(row, k) + kPrefetchBytes, _MM_HINT_T0);
      _mm512_storeu_si512(o + k, reinterpret_cast<__m512i>(Fmt::Load(row, k)));
    }
    if (kmain < K) {
      const __mmask32 m = TailMask(K - kmain);
      _mm512_mask_storeu_epi16(o + kmain, m,
                               reinterpret_cast<__m512i>(Fmt::LoadTail(row, kmain, m)));
    }
  }
}

// y[0..MR) x [0..NR) = x[MR rows] . w[rows n0..n0+NR)^T, full K.
// scales (int8): the NR rows' scales, multiplying each finished dot product before the bias.
template <int MR, int NR, bool kPrefetch, class Fmt>
void Tile(const uint16_t* x, int64_t ldx, const MatMulWeight& wt, int64_t n0, int64_t K,
          const float* scales, const float* bias, float* y, int64_t ldy) {
  typename Fmt::Row rows[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) rows[j] = Fmt::MakeRow(wt, n0 + j, K);
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const int64_t kmain = K - K % 32;
  const int64_t row_bytes = Fmt::RowBytes(K);
  for (int64_t k = 0; k < kmain; k += 32) {
    __m512bh xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = Bh(_mm512_loadu_si512(x + i * ldx + k));
    // kPrefetchBytes ahead in each row or, past its end, in the next tile's row (consecutive
    // tiles' rows are consecutive in memory): a tile starts with its first lines on the way.
    int64_t pf = kPrefetchBytes;
    if constexpr (kPrefetch) {
      if (Fmt::Addr(rows[0], k) - Fmt::Addr(rows[0], 0) + kPrefetchBytes >= row_bytes) {
        pf += (NR - 1) * row_bytes;
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if constexpr (kPrefetch) _mm_prefetch(Fmt::Addr(rows[j], k) + pf, _MM_HINT_T0);
      const __m512bh wv = Fmt::Load(rows[j], k);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
    }
  }
  if (kmain < K) {
    const __mmask32 m = TailMask(K - kmain);
    __m512bh xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = Bh(_mm512_maskz_loadu_epi16(m, x + i * ldx + kmain));
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const __m512bh wv = Fmt::LoadTail(rows[j], kmain, m);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      if (scales != nullptr) s *= scales[j];
      if (bias != nullptr) s += bias[j];
      y[i * ldy + j] = s;
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const MatMulWeight&, int64_t, int64_t,
                        const float*, const float*, float*, int64_t);

// Register tile shapes (24 accumulators each). Wide: 4 input rows x 6 weight rows, six weight
// streams, for few rows (decode batches up to 8, where the first row tile streams the weights
// from memory). Tall: 6 x 4, fewer weight loads from L2 per product (4 weight + 6 input vectors
// per 24 vdpbf16ps), for more rows.
struct Wide {
  static constexpr int kMR = 4, kNR = 6;
};
struct Tall {
  static constexpr int kMR = 6, kNR = 4;
};

template <bool kPrefetch, class Fmt, class Shape, int... I>
constexpr TileFn kTiles[] = {&Tile<I / Shape::kNR + 1, I % Shape::kNR + 1, kPrefetch, Fmt>...};

template <bool kPrefetch, class Fmt, class Shape, int... I>
constexpr const TileFn* TilesOf(std::integer_sequence<int, I...>) {
  return kTiles<kPrefetch, Fmt, Shape, I...>;
}

// Columns [n0, n1) over weight rows in format Fmt, in blocks of `block` rows; scales (int8) and
// bias indexed like the columns.
template <class Fmt, class Shape>
void RangeOf(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
             int64_t n0, int64_t n1, const float* scales, const float* bias, float* y, int64_t ldy,
             int64_t block) {
  constexpr int kMR = Shape::kMR, kNR = Shape::kNR;
  // The first row tile of a block streams its weights from memory: prefetched (as in the f32
  // path). With many rows the other tiles find the block in L2, where prefetching only costs.
  const TileFn* first = TilesOf<true, Fmt, Shape>(std::make_integer_sequence<int, kMR * kNR>());
  const TileFn* rest =
      M <= kPrefetchAllRows
          ? first
          : TilesOf<false, Fmt, Shape>(std::make_integer_sequence<int, kMR * kNR>());
  if (M > kMR && M <= kPrefetchAllRows) {
    // A decode batch of a few row tiles: all of them over each group of weight rows in turn, the
    // later ones from L1, while the prefetches of every tile keep the next rows streaming in.
    // (Block by block, the memory would idle while the later row tiles ran from L2.)
    for (int64_t n = n0; n < n1; n += kNR) {
      const int nr = static_cast<int>(n1 - n < kNR ? n1 - n : kNR);
      for (int64_t m = 0; m < M; m += kMR) {
        const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
        first[(mr - 1) * kNR + (nr - 1)](
            x + m * ldx, ldx, w, n, K, scales != nullptr ? scales + n : nullptr,
            bias != nullptr ? bias + n : nullptr, y + m * ldy + n, ldy);
      }
    }
    return;
  }
  // A lone row reuses nothing from L2: blocks would only cut its weight streams short (K = 8192:
  // 12-row blocks, one 1x8 and one 1x4 tile each), so its tiles run over the whole range.
  if (M == 1) block = n1 - n0;
  for (int64_t b0 = n0; b0 < n1; b0 += block) {
    const int64_t b1 = b0 + block < n1 ? b0 + block : n1;
    for (int64_t m = 0; m < M; m += kMR) {
      const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
      int64_t n = b0;
      if (mr == 1) {  // a lone row: more weight rows in flight
        for (; n + kNR1 <= b1; n += kNR1) {
          Tile<1, kNR1, true, Fmt>(x + m * ldx, ldx, w, n, K,
                                   scales != nullptr ? scales + n : nullptr,
                                   bias != nullptr ? bias + n : nullptr, y + m * ldy + n, ldy);
        }
      }
      const TileFn* tiles = m == 0 ? first : rest;
      for (; n < b1; n += kNR) {
        const int nr = static_cast<int>(b1 - n < kNR ? b1 - n : kNR);
        tiles[(mr - 1) * kNR + (nr - 1)](
            x + m * ldx, ldx, w, n, K, scales != nullptr ? scales + n : nullptr,
            bias != nullptr ? bias + n : nullptr, y + m * ldy + n, ldy);
      }
    }
  }
}

// Wide tiles up to kPrefetchAllRows rows (decode batches: six weight streams from memory), Tall
// ones beyond (most row tiles find the weights in L2). Only the grouping of outputs differs,
// never their arithmetic.
template <class Fmt>
void Range(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w, int64_t n0,
           int64_t n1, const float* scales, const float* bias, float* y, int64_t ldy,
           int64_t block) {
  if constexpr (std::is_same_v<Fmt, Bf16Fmt>) {  // quantized formats come with M <= kMR
    if (M > kPrefetchAllRows) {
      RangeOf<Fmt, Tall>(x, M, K, ldx, w, n0, n1, scales, bias, y, ldy, block);
      return;
    }
  }
  RangeOf<Fmt, Wide>(x, M, K, ldx, w, n0, n1, scales, bias, y, ldy, block);
}

// Quantized weights: up to kMR activation rows (one row tile: each weight is dequantized once
// either way) dequantize in registers inside the tiles; more rows dequantize each block of rows
// once into `scratch` and run the bf16 tiles over it, instead of once per row tile (the same bf16
// weights either way, so the same bits).
template <class Fmt>
void QuantRange(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
                int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy, uint16_t* scratch,
                int64_t scratch_rows) {
  const float* scales = w.quant == WeightQuant::kInt8 ? w.scales : nullptr;
  const int64_t dense_block = K > 0 ? kBlockBytes / (K * 2) / kNR * kNR : kNR;
  if (M <= kMR) {
    Range<Fmt>(x, M, K, ldx, w, n0, n1, scales, bias, y, ldy,
               dense_block < kNR ? kNR : dense_block);
    return;
  }
  MatMulWeight dense;
  dense.data = scratch;
  dense.dtype = DType::kBF16;
  for (int64_t b0 = n0; b0 < n1; b0 += scratch_rows) {
    const int64_t b1 = b0 + scratch_rows < n1 ? b0 + scratch_rows : n1;
    DequantRows<Fmt>(w, K, b0, b1, scratch);
    Range<Bf16Fmt>(x, M, K, ldx, dense, 0, b1 - b0, scales != nullptr ? scales + b0 : nullptr,
                   bias != nullptr ? bias + b0 : nullptr, y + b0, ldy, b1 - b0);
  }
}

}  // namespace

void MatMulBf16Avx512(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
                      int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy,
                      uint16_t* scratch, int64_t scratch_rows) {
  switch (w.quant) {
    case WeightQuant::kInt8:
      QuantRange<Int8Fmt>(x, M, K, ldx, w, n0, n1, bias, y, ldy, scratch, scratch_rows);
      return;
    case WeightQuant::kInt4:
      QuantRange<Int4Fmt>(x, M, K, ldx, w, n0, n1, bias, y, ldy, scratch, scratch_rows);
      return;
    case WeightQuant::kFp8:  // never sent here: MatMulPathOf gives fp8 the generic bf16 path
      __builtin_trap();
    case WeightQuant::kNone:
      break;
  }
  int64_t block = K > 0 ? kBlockBytes / (K * 2) / kNR * kNR : kNR;
  Range<Bf16Fmt>(x, M, K, ldx, w, n0, n1, nullptr, bias, y, ldy, block < kNR ? kNR : block);
}

}  // namespace tandem::cpu::internal
