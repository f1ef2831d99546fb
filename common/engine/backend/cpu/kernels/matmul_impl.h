#pragma once

// MatMul templates, instantiated once per ISA with that ISA's Simd type (simd_*.h). Only
// templates live here: each ISA file compiles its own instantiations with its own flags.
//
// Arithmetic of every output y[m, n] (the batch-invariance rule): one accumulator vector of
// S::kLanes lanes starts at +0; for k = 0, L, 2L, ... while k + L <= K: acc = fma(x[k:k+L],
// w[k:k+L], acc); then, if K % L != 0, one more fma with both tails zero-padded (masked loads);
// then S::ReduceAdd(acc) (a fixed tree), then + bias[n]. Tile shapes and loop order only choose
// which outputs are computed together; they never change this sequence.

#include <cstdint>
#include <utility>

#include "common/base/dtype.h"
#include "common/engine/backend/cpu/kernels/fn_table.h"

namespace tandem::cpu::impl {

// Software prefetch distance ahead of the weight stream (decode is memory-bound).
inline constexpr int64_t kMatMulPrefetchBytes = 1024;
// Weight rows per block: a block is loaded once from memory and reused from L2 by every
// activation row tile.
inline constexpr int64_t kMatMulBlockBytes = 256 * 1024;

// y[0..MR) x [0..NR) = x[MR rows] . w[NR rows]^T, full K.
template <class S, int MR, int NR, class WT, bool kPrefetch>
void MatMulTile(const float* x, int64_t ldx, const WT* w, int64_t K, const float* bias, float* y,
                int64_t ldy) {
  using F = typename S::F;
  constexpr int L = S::kLanes;
  F acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = S::Zero();
  }
  const int64_t kmain = K - K % L;
  for (int64_t k = 0; k < kmain; k += L) {
    F xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = S::Load(x + i * ldx + k);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const WT* wp = w + j * K + k;
      if constexpr (kPrefetch)
        S::Prefetch(reinterpret_cast<const char*>(wp) + kMatMulPrefetchBytes);
      F wv = S::Load(wp);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc[i][j] = S::Fma(xv[i], wv, acc[i][j]);
    }
  }
  if (kmain < K) {
    const int t = static_cast<int>(K - kmain);
    F xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = S::LoadTail(x + i * ldx + kmain, t);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      F wv = S::LoadTail(w + j * K + kmain, t);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc[i][j] = S::Fma(xv[i], wv, acc[i][j]);
    }
  }
  // Horizontal sums, four at a time where possible (ReduceAdd4 adds exactly as ReduceAdd).
  float sums[MR * NR];
  int e = 0;
#pragma GCC unroll 8
  for (; e + 4 <= MR * NR; e += 4) {
    S::ReduceAdd4(acc[e / NR][e % NR], acc[(e + 1) / NR][(e + 1) % NR],
                  acc[(e + 2) / NR][(e + 2) % NR], acc[(e + 3) / NR][(e + 3) % NR], sums + e);
  }
#pragma GCC unroll 4
  for (; e < MR * NR; ++e) sums[e] = S::ReduceAdd(acc[e / NR][e % NR]);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      float s = sums[i * NR + j];
      if (bias != nullptr) s += bias[j];
      y[i * ldy + j] = s;
    }
  }
}

template <class WT>
using MatMulTileFn = void (*)(const float*, int64_t, const WT*, int64_t, const float*, float*,
                              int64_t);

// Table of every tile shape 1..kMR x 1..kNR, indexed (mr - 1) * kNR + (nr - 1).
template <class S, class WT, bool kPrefetch, size_t... I>
constexpr FnTable<S, MatMulTileFn<WT>, sizeof...(I)> MakeMatMulTiles(std::index_sequence<I...>) {
  return {{&MatMulTile<S, static_cast<int>(I / S::kNR) + 1, static_cast<int>(I % S::kNR) + 1, WT,
                       kPrefetch>...}};
}

template <class S, class WT, bool kPrefetch>
inline constexpr auto kMatMulTiles =
    MakeMatMulTiles<S, WT, kPrefetch>(std::make_index_sequence<S::kMR * S::kNR>());

template <class S, class WT>
void MatMulRangeTyped(const float* x, int64_t M, int64_t K, int64_t ldx, const WT* w, int64_t n0,
                      int64_t n1, const float* bias, float* y, int64_t ldy) {
  constexpr int MR = S::kMR, NR = S::kNR;
  // Few activation rows: each weight block is touched by few tiles, so the stream from memory
  // dominates and software prefetch helps. Many rows: compute-bound, the block sits in L2.
  const auto& tiles = M <= 2 * MR ? kMatMulTiles<S, WT, true> : kMatMulTiles<S, WT, false>;
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(WT));
  int64_t block = row_bytes > 0 ? kMatMulBlockBytes / row_bytes / NR * NR : NR;
  if (block < NR) block = NR;
  for (int64_t b0 = n0; b0 < n1; b0 += block) {
    const int64_t b1 = b0 + block < n1 ? b0 + block : n1;
    for (int64_t m = 0; m < M; m += MR) {
      const int mr = static_cast<int>(M - m < MR ? M - m : MR);
      int64_t n = b0;
      if (mr == 1) {  // a lone row: more weight rows in flight
        for (; n + S::kNR1 <= b1; n += S::kNR1) {
          MatMulTile<S, 1, S::kNR1, WT, true>(x + m * ldx, ldx, w + n * K, K,
                                              bias != nullptr ? bias + n : nullptr, y + m * ldy + n,
                                              ldy);
        }
      }
      for (; n < b1; n += NR) {
        const int nr = static_cast<int>(b1 - n < NR ? b1 - n : NR);
        tiles.fn[(mr - 1) * NR + (nr - 1)](x + m * ldx, ldx, w + n * K, K,
                                           bias != nullptr ? bias + n : nullptr, y + m * ldy + n,
                                           ldy);
      }
    }
  }
}

template <class S>
void MatMulRange(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType wtype,
                 int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  if (wtype == DType::kBF16) {
    MatMulRangeTyped<S>(x, M, K, ldx, static_cast<const uint16_t*>(w), n0, n1, bias, y, ldy);
  } else {
    MatMulRangeTyped<S>(x, M, K, ldx, static_cast<const float*>(w), n0, n1, bias, y, ldy);
  }
}

}  // namespace tandem::cpu::impl
