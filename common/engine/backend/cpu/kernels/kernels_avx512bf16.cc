// MatMul with bf16 inputs and dense bf16 weights on AVX512_BF16 (vdpbf16ps: 32 bf16 products per
// instruction, summed pairwise into 16 f32 lanes). Compiled with this ISA's flags only (see
// CMakeLists.txt); the dispatcher calls it only when the CPU has AVX512_BF16. Everything here has
// internal linkage except MatMulBf16Avx512 (see README.md, "ODR").
//
// Arithmetic of every output y[m, n] (its batch-invariance rule): one accumulator of 16 f32 lanes
// starts at +0; for k = 0, 32, 64, ... while k + 32 <= K: acc = vdpbf16ps(acc, x[k:k+32],
// w[k:k+32]); then, if K % 32 != 0, one more with both tails zero-padded (masked loads); then
// _mm512_reduce_add_ps (one fixed tree), then + bias[n]. Tiles only choose which outputs are
// computed together.

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "common/engine/backend/cpu/kernels/kernels_internal.h"

namespace tandem::cpu::internal {
namespace {

constexpr int kMR = 4;   // activation rows per register tile
constexpr int kNR = 6;   // weight rows per register tile (24 accumulators)
constexpr int kNR1 = 8;  // weight rows per tile for a lone activation row
constexpr int64_t kPrefetchBytes = 1024;
constexpr int64_t kBlockBytes = 256 * 1024;

inline __m512bh LoadBh(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

inline __m512bh LoadBhTail(const uint16_t* p, __mmask32 mask) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, p));
}

template <int MR, int NR, bool kPrefetch>
void Tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K, const float* bias, float* y,
          int64_t ldy) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const int64_t kmain = K - K % 32;
  for (int64_t k = 0; k < kmain; k += 32) {
    __m512bh xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = LoadBh(x + i * ldx + k);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const uint16_t* wr = w + j * K + k;
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(wr) + kPrefetchBytes, _MM_HINT_T0);
      }
      const __m512bh wv = LoadBh(wr);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
    }
  }
  if (kmain < K) {
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (K - kmain)) - 1);
    __m512bh xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = LoadBhTail(x + i * ldx + kmain, mask);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const __m512bh wv = LoadBhTail(w + j * K + kmain, mask);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      if (bias != nullptr) s += bias[j];
      y[i * ldy + j] = s;
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, const float*, float*,
                        int64_t);

template <bool kPrefetch, int... I>
constexpr TileFn kTiles[] = {&Tile<I / kNR + 1, I % kNR + 1, kPrefetch>...};

template <bool kPrefetch, int... I>
constexpr const TileFn* TilesOf(std::integer_sequence<int, I...>) {
  return kTiles<kPrefetch, I...>;
}

}  // namespace

void MatMulBf16Avx512(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& wt,
                      int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  const auto* w = static_cast<const uint16_t*>(wt.data);
  // Few activation rows: the weight stream from memory dominates, prefetch helps (as in the f32
  // path); many rows: compute-bound, each block sits in L2.
  const TileFn* tiles = M <= 2 * kMR ? TilesOf<true>(std::make_integer_sequence<int, kMR * kNR>())
                                     : TilesOf<false>(std::make_integer_sequence<int, kMR * kNR>());
  const int64_t row_bytes = K * 2;
  int64_t block = row_bytes > 0 ? kBlockBytes / row_bytes / kNR * kNR : kNR;
  if (block < kNR) block = kNR;
  for (int64_t b0 = n0; b0 < n1; b0 += block) {
    const int64_t b1 = b0 + block < n1 ? b0 + block : n1;
    for (int64_t m = 0; m < M; m += kMR) {
      const int mr = static_cast<int>(M - m < kMR ? M - m : kMR);
      int64_t n = b0;
      if (mr == 1) {  // a lone row: more weight rows in flight
        for (; n + kNR1 <= b1; n += kNR1) {
          Tile<1, kNR1, true>(x + m * ldx, ldx, w + n * K, K, bias != nullptr ? bias + n : nullptr,
                              y + m * ldy + n, ldy);
        }
      }
      for (; n < b1; n += kNR) {
        const int nr = static_cast<int>(b1 - n < kNR ? b1 - n : kNR);
        tiles[(mr - 1) * kNR + (nr - 1)](x + m * ldx, ldx, w + n * K, K,
                                         bias != nullptr ? bias + n : nullptr, y + m * ldy + n,
                                         ldy);
      }
    }
  }
}

}  // namespace tandem::cpu::internal
