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
#include "common/base/quant.h"
#include "common/engine/backend/cpu/kernels/fn_table.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cpu/kernels/kernels_internal.h"
#include "common/engine/backend/cpu/kernels/kv_types.h"

namespace tandem::cpu::impl {

// Software prefetch distance ahead of the weight stream (decode is memory-bound).
inline constexpr int64_t kMatMulPrefetchBytes = 1024;
// Weight rows per block: a block is loaded once from memory and reused from L2 by every
// activation row tile.
inline constexpr int64_t kMatMulBlockBytes = 256 * 1024;

// Weight row formats. Fmt::MakeRow(w, n, K) gives a handle on row n; Load(row, k) is the f32
// vector of elements [k, k + L) (k a multiple of L), LoadTail(row, k, t) its first t lanes with the
// others +0; Addr(row, k) the address of element k's bytes (for prefetch).
template <class S, class WT>
struct DenseFmt {
  using F = typename S::F;
  using Row = const WT*;
  static Row MakeRow(const MatMulWeight& w, int64_t n, int64_t K) {
    return static_cast<const WT*>(w.data) + n * K;
  }
  static F Load(Row r, int64_t k) { return S::Load(r + k); }
  static F LoadTail(Row r, int64_t k, int t) { return S::LoadTail(r + k, t); }
  static const char* Addr(Row r, int64_t k) { return reinterpret_cast<const char*>(r + k); }
  static int64_t RowBytes(int64_t K) { return K * static_cast<int64_t>(sizeof(WT)); }
};

// int8, one scale per row: w = float(q) * scale[n].
template <class S>
struct Int8Fmt {
  using F = typename S::F;
  struct Row {
    const int8_t* q;
    F s;
  };
  static Row MakeRow(const MatMulWeight& w, int64_t n, int64_t K) {
    return Row{static_cast<const int8_t*>(w.data) + n * K, S::Set1(w.scales[n])};
  }
  static F Load(const Row& r, int64_t k) { return S::Mul(S::LoadI8(r.q + k), r.s); }
  static F LoadTail(const Row& r, int64_t k, int t) {
    return S::ZeroTail(S::Mul(S::LoadI8Tail(r.q + k, t), r.s), t);
  }
  static const char* Addr(const Row& r, int64_t k) {
    return reinterpret_cast<const char*>(r.q + k);
  }
  static int64_t RowBytes(int64_t K) { return K; }
};

// fp8 e4m3, one scale per row: w = (code's value * 2^-8) * (256 * scale[n]), the loads' exact
// widening (as the fp8 KV cache's) times an exact rescaling of the scale: the same f32 product as
// e4m3(q) * scale[n] (quant.h).
template <class S>
struct Fp8Fmt {
  using F = typename S::F;
  struct Row {
    const Fp8E4M3* q;
    F s;
  };
  static Row MakeRow(const MatMulWeight& w, int64_t n, int64_t K) {
    return Row{static_cast<const Fp8E4M3*>(w.data) + n * K, S::Set1(w.scales[n] * 256.0f)};
  }
  static F Load(const Row& r, int64_t k) { return S::Mul(S::Load(r.q + k), r.s); }
  static F LoadTail(const Row& r, int64_t k, int t) {
    return S::ZeroTail(S::Mul(S::LoadTail(r.q + k, t), r.s), t);
  }
  static const char* Addr(const Row& r, int64_t k) {
    return reinterpret_cast<const char*>(r.q + k);
  }
  static int64_t RowBytes(int64_t K) { return K; }
};

// int4 groups with zero points: w = (float(q) - zero[n, g]) * scale[n, g], g = k >> shift.
// Packing (quant.h): 32-element chunks of 16 bytes, element c*32 + j in the low nibble of byte
// c*16 + j (j < 16) and element c*32 + 16 + j in its high nibble.
template <class S>
struct Int4Fmt {
  using F = typename S::F;
  using Row = internal::Int4Row;
  static Row MakeRow(const MatMulWeight& w, int64_t n, int64_t K) {
    return internal::MakeInt4Row(w, n, K);
  }
  static F Dequant(const Row& r, int64_t k) {
    const int64_t g = k >> r.shift;
    const F q = S::LoadU4(r.q + (k >> 5) * 16 + (k & 15), static_cast<int>((k >> 4) & 1) * 4);
    return S::Mul(S::Sub(q, S::Set1(r.z[g])), S::Set1(r.s[g]));
  }
  static F Load(const Row& r, int64_t k) { return Dequant(r, k); }
  // 16 lanes: elements [k, k + 16) and [k + 16, k + 32) of one chunk (k a multiple of 32, so both
  // lie in one group), each exactly as Load would give them, from one load and one widening.
  static constexpr bool kPairs = S::kLanes == 16;
  static void LoadPair(const Row& r, int64_t k, F* w0, F* w1) {
    if constexpr (kPairs) {
      const int64_t g = k >> r.shift;
      const F z = S::Set1(r.z[g]), s = S::Set1(r.s[g]);
      F q0, q1;
      S::LoadU4Pair(r.q + (k >> 5) * 16, &q0, &q1);
      *w0 = S::Mul(S::Sub(q0, z), s);
      *w1 = S::Mul(S::Sub(q1, z), s);
    }
  }
  // Rows are padded to whole chunks, so the full load stays inside the row.
  static F LoadTail(const Row& r, int64_t k, int t) { return S::ZeroTail(Dequant(r, k), t); }
  static const char* Addr(const Row& r, int64_t k) {
    return reinterpret_cast<const char*>(r.q + (k >> 5) * 16);
  }
  static int64_t RowBytes(int64_t K) { return (K + 31) / 32 * 16; }
};

// Whether Fmt loads two vectors at once (Fmt::kPairs and LoadPair).
template <class Fmt>
constexpr bool HasPairs() {
  if constexpr (requires { Fmt::kPairs; }) {
    return Fmt::kPairs;
  } else {
    return false;
  }
}

// y[0..MR) x [0..NR) = x[MR rows] . w[NR rows]^T, full K.
template <class S, int MR, int NR, class Fmt, bool kPrefetch>
void MatMulTile(const float* x, int64_t ldx, const MatMulWeight& wt, int64_t n0, int64_t K,
                const float* bias, float* y, int64_t ldy) {
  using F = typename S::F;
  constexpr int L = S::kLanes;
  typename Fmt::Row rows[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) rows[j] = Fmt::MakeRow(wt, n0 + j, K);
  F acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = S::Zero();
  }
  const int64_t kmain = K - K % L;
  // kMatMulPrefetchBytes ahead in each row or, past its end, in the next tile's row (consecutive
  // tiles' rows are consecutive in memory): a tile starts with its first lines on the way.
  const int64_t row_bytes = Fmt::RowBytes(K);
  auto prefetch_offset = [&](int64_t k) {
    return Fmt::Addr(rows[0], k) - Fmt::Addr(rows[0], 0) + kMatMulPrefetchBytes < row_bytes
               ? kMatMulPrefetchBytes
               : kMatMulPrefetchBytes + (NR - 1) * row_bytes;
  };
  int64_t k0 = 0;
  if constexpr (HasPairs<Fmt>()) {
    // Two vectors per chunk load; each accumulator still sees fma(k) then fma(k + L), the same
    // chain as the loop below.
    for (; k0 + 2 * L <= kmain; k0 += 2 * L) {
      F xv0[MR], xv1[MR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        xv0[i] = S::Load(x + i * ldx + k0);
        xv1[i] = S::Load(x + i * ldx + k0 + L);
      }
      const int64_t pf = kPrefetch ? prefetch_offset(k0) : 0;
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        if constexpr (kPrefetch) S::Prefetch(Fmt::Addr(rows[j], k0) + pf);
        F w0, w1;
        Fmt::LoadPair(rows[j], k0, &w0, &w1);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) acc[i][j] = S::Fma(xv0[i], w0, acc[i][j]);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) acc[i][j] = S::Fma(xv1[i], w1, acc[i][j]);
      }
    }
  }
  for (int64_t k = k0; k < kmain; k += L) {
    F xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = S::Load(x + i * ldx + k);
    const int64_t pf = kPrefetch ? prefetch_offset(k) : 0;
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if constexpr (kPrefetch) S::Prefetch(Fmt::Addr(rows[j], k) + pf);
      F wv = Fmt::Load(rows[j], k);
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
      F wv = Fmt::LoadTail(rows[j], kmain, t);
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

template <class Fmt>
using MatMulTileFn = void (*)(const float*, int64_t, const MatMulWeight&, int64_t, int64_t,
                              const float*, float*, int64_t);

// Table of every tile shape 1..kMR x 1..kNR, indexed (mr - 1) * kNR + (nr - 1).
template <class S, class Fmt, bool kPrefetch, size_t... I>
constexpr FnTable<S, MatMulTileFn<Fmt>, sizeof...(I)> MakeMatMulTiles(std::index_sequence<I...>) {
  return {{&MatMulTile<S, static_cast<int>(I / S::kNR) + 1, static_cast<int>(I % S::kNR) + 1, Fmt,
                       kPrefetch>...}};
}

template <class S, class Fmt, bool kPrefetch>
inline constexpr auto kMatMulTiles =
    MakeMatMulTiles<S, Fmt, kPrefetch>(std::make_index_sequence<S::kMR * S::kNR>());

template <class S, class Fmt>
void MatMulRangeTyped(const float* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
                      int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  constexpr int MR = S::kMR, NR = S::kNR;
  // The first row tile of a block streams its weights from memory: prefetched. With many rows
  // the other tiles find the block in L2, where prefetching only costs.
  const auto& first = kMatMulTiles<S, Fmt, true>;
  const auto& rest = M <= 2 * MR ? kMatMulTiles<S, Fmt, true> : kMatMulTiles<S, Fmt, false>;
  const int64_t row_bytes = Fmt::RowBytes(K);
  int64_t block = row_bytes > 0 ? kMatMulBlockBytes / row_bytes / NR * NR : NR;
  if (block < NR) block = NR;
  for (int64_t b0 = n0; b0 < n1; b0 += block) {
    const int64_t b1 = b0 + block < n1 ? b0 + block : n1;
    for (int64_t m = 0; m < M; m += MR) {
      const int mr = static_cast<int>(M - m < MR ? M - m : MR);
      int64_t n = b0;
      if (mr == 1) {  // a lone row: more weight rows in flight
        for (; n + S::kNR1 <= b1; n += S::kNR1) {
          MatMulTile<S, 1, S::kNR1, Fmt, true>(x + m * ldx, ldx, w, n, K,
                                               bias != nullptr ? bias + n : nullptr,
                                               y + m * ldy + n, ldy);
        }
      }
      const auto& tiles = m == 0 ? first : rest;
      for (; n < b1; n += NR) {
        const int nr = static_cast<int>(b1 - n < NR ? b1 - n : NR);
        tiles.fn[(mr - 1) * NR + (nr - 1)](
            x + m * ldx, ldx, w, n, K, bias != nullptr ? bias + n : nullptr, y + m * ldy + n, ldy);
      }
    }
  }
}

template <class S>
void MatMulRange(const float* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
                 int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) {
  switch (w.quant) {
    case WeightQuant::kInt8:
      MatMulRangeTyped<S, Int8Fmt<S>>(x, M, K, ldx, w, n0, n1, bias, y, ldy);
      return;
    case WeightQuant::kInt4:
      MatMulRangeTyped<S, Int4Fmt<S>>(x, M, K, ldx, w, n0, n1, bias, y, ldy);
      return;
    case WeightQuant::kFp8:
      MatMulRangeTyped<S, Fp8Fmt<S>>(x, M, K, ldx, w, n0, n1, bias, y, ldy);
      return;
    case WeightQuant::kNone:
      break;
  }
  if (w.dtype == DType::kBF16) {
    MatMulRangeTyped<S, DenseFmt<S, uint16_t>>(x, M, K, ldx, w, n0, n1, bias, y, ldy);
  } else {
    MatMulRangeTyped<S, DenseFmt<S, float>>(x, M, K, ldx, w, n0, n1, bias, y, ldy);
  }
}

}  // namespace tandem::cpu::impl
