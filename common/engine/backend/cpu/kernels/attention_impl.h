#pragma once

// Paged KV cache writes/reads and paged attention as templates over an ISA's Simd type. Only
// templates live here (see matmul_impl.h).
//
// Arithmetic of one (query, head) pair, the same in every batch and thread partition:
//   span = [start, L) with start = max(0, L - window) when window > 0;
//   s[j] = ReduceAdd(lane-wise fma over head_dim, zero-padded tail)(q, k_j) * scale, j ascending;
//   mx = max_j s[j];  p[j] = Exp(s[j] - mx) in vectors of kLanes from `start`;
//   sum = ReduceAdd(lane-wise sum of the p vectors, zero-padded tail);
//   out[d] = (sum_j p[j] * v_j[d], fma chain over j ascending from +0) * (1 / sum)
//   (the chain may pause in memory between chunks of positions: same values).
// A work item may hold several queries of one sequence at consecutive positions (AttentionTyped):
// they share each K and V row load, and each one's arithmetic stays the above.

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/base/dtype.h"
#include "common/base/quant.h"
#include "common/engine/backend/cpu/kernels/elementwise_impl.h"
#include "common/engine/backend/cpu/kernels/fn_table.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cpu/kernels/kv_types.h"

namespace tandem::cpu::impl {

// PagedKvLayer::block_stride_elems(), as a template: ISA files call no shared inline function.
template <class S>
inline int64_t BlockStride(const PagedKvLayer& kv) {
  const int64_t rows = 2 * kv.num_kv_heads * kv.block_size;
  return rows * kv.head_dim + (kv.dtype == DType::kI8 || kv.dtype == DType::kF8E4M3 ? rows * 4 : 0);
}

// Quantized KV element types carry a per-row f32 scale after the block's codes.
template <class KT>
inline constexpr bool kKvQuantized = sizeof(KT) == 1;

// Byte offset, inside a block, of the scale of row 0 of (which, kv head h); rows follow at 4 bytes.
template <class S>
inline int64_t KvScaleExtra(const PagedKvLayer& kv, int which, int64_t h) {
  return 2 * kv.num_kv_heads * kv.block_size * kv.head_dim +
         (which * kv.num_kv_heads + h) * kv.block_size * 4;
}

template <class S>
inline float* KvScalePtr(const PagedKvLayer& kv, int64_t slot, int which, int64_t h) {
  const int64_t block = slot / kv.block_size, off = slot % kv.block_size;
  return reinterpret_cast<float*>(static_cast<char*>(kv.base) + block * BlockStride<S>(kv) +
                                  KvScaleExtra<S>(kv, which, h) + off * 4);
}

// fp8 e4m3 code (round to nearest even, saturating at 448): common/base/quant.h's conversion.
template <class S>
inline uint8_t F32ToFp8E4M3(float x) {
  return Fp8E4M3Code(x);
}

// The value of an fp8 e4m3 code times 2^-8 (what S::Load of Fp8E4M3 gives).
template <class S>
inline float Fp8E4M3ToF32Scaled(uint8_t c) {
  return Fp8E4M3ValueScaled(c);
}

// Offset (in elements) of a slot's K (which = 0) or V (which = 1) row of kv head h.
template <class S>
inline int64_t KvRowOffset(const PagedKvLayer& kv, int64_t slot, int which, int64_t h) {
  const int64_t block = slot / kv.block_size, off = slot % kv.block_size;
  return block * BlockStride<S>(kv) +
         ((which * kv.num_kv_heads + h) * kv.block_size + off) * kv.head_dim;
}

template <class S>
void WriteKv(const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t M,
             const int64_t* slots, const PagedKvLayer& kv) {
  const int64_t hd = kv.head_dim;
  for (int64_t m = 0; m < M; ++m) {
    if (slots[m] < 0) continue;
    for (int which = 0; which < 2; ++which) {
      const float* src_row = which == 0 ? k + m * ldk : v + m * ldv;
      for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
        const float* src = src_row + h * hd;
        const int64_t off = KvRowOffset<S>(kv, slots[m], which, h);
        if (kv.dtype == DType::kI8 || kv.dtype == DType::kF8E4M3) {
          float amax = 0.0f;
          for (int64_t d = 0; d < hd; ++d) {
            const float a = src[d] < 0.0f ? -src[d] : src[d];
            amax = a > amax ? a : amax;
          }
          uint8_t* dst = static_cast<uint8_t*>(kv.base) + off;
          float* scale = KvScalePtr<S>(kv, slots[m], which, h);
          if (kv.dtype == DType::kI8) {
            const float sc = amax / 127.0f;
            *scale = sc;
            for (int64_t d = 0; d < hd; ++d) {
              float q = sc > 0.0f ? __builtin_rintf(src[d] / sc) : 0.0f;
              q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
              dst[d] = static_cast<uint8_t>(static_cast<int8_t>(q));
            }
          } else {
            const float sc = amax / 448.0f;
            *scale = sc * 256.0f;  // the loads give e4m3 values times 2^-8
            for (int64_t d = 0; d < hd; ++d) {
              dst[d] = sc > 0.0f ? F32ToFp8E4M3<S>(src[d] / sc) : uint8_t{0};
            }
          }
        } else if (kv.dtype == DType::kBF16) {
          uint16_t* dst = static_cast<uint16_t*>(kv.base) + off;
          for (int64_t d = 0; d < hd; ++d) dst[d] = F32ToBf16Bits<S>(src[d]);
        } else {
          float* dst = static_cast<float*>(kv.base) + off;
          for (int64_t d = 0; d < hd; ++d) dst[d] = src[d];
        }
      }
    }
  }
}

template <class S>
void ReadKvSlot(const PagedKvLayer& kv, int64_t slot, int which, float* out) {
  const int64_t hd = kv.head_dim;
  for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
    const int64_t off = KvRowOffset<S>(kv, slot, which, h);
    if (kv.dtype == DType::kI8 || kv.dtype == DType::kF8E4M3) {
      const uint8_t* src = static_cast<const uint8_t*>(kv.base) + off;
      const float sc = *KvScalePtr<S>(kv, slot, which, h);
      for (int64_t d = 0; d < hd; ++d) {
        const float c = kv.dtype == DType::kI8 ? static_cast<float>(static_cast<int8_t>(src[d]))
                                               : Fp8E4M3ToF32Scaled<S>(src[d]);
        out[h * hd + d] = c * sc;
      }
    } else if (kv.dtype == DType::kBF16) {
      const uint16_t* src = static_cast<const uint16_t*>(kv.base) + off;
      for (int64_t d = 0; d < hd; ++d) out[h * hd + d] = Bf16BitsToF32<S>(src[d]);
    } else {
      const float* src = static_cast<const float*>(kv.base) + off;
      for (int64_t d = 0; d < hd; ++d) out[h * hd + d] = src[d];
    }
  }
}

// Dot product in the fixed order (lane accumulators, zero-padded tail, ReduceAdd).
template <class S, class KT>
float Dot(const float* a, const KT* b, int64_t n) {
  constexpr int L = S::kLanes;
  typename S::F acc = S::Zero();
  const int64_t main = n - n % L;
  for (int64_t d = 0; d < main; d += L) acc = S::Fma(S::Load(a + d), S::Load(b + d), acc);
  if (main < n) {
    const int t = static_cast<int>(n - main);
    acc = S::Fma(S::LoadTail(a + main, t), S::LoadTail(b + main, t), acc);
  }
  return S::ReduceAdd(acc);
}

// s[h][i] = Dot(q[h], k_rows[i]) * scale for i < P and H slots (a slot is one query head;
// several heads of a GQA group, or one head of several queries of a sequence): the arithmetic of
// Dot, H * P chains interleaved (enough independent fmas to hide their latency).
template <class S, class KT, int P, int H>
void ScoresTile(const float* const* q, int64_t hd, const KT* base, const int64_t* rows,
                const float* row_scales, float scale, float* const* s) {
  using F = typename S::F;
  constexpr int L = S::kLanes;
  const int64_t main = hd - hd % L;
  const int t = static_cast<int>(hd - main);
  F acc[H][P];
#pragma GCC unroll 4
  for (int h = 0; h < H; ++h) {
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) acc[h][i] = S::Zero();
  }
  for (int64_t d = 0; d < main; d += L) {
    F kv[P];
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) kv[i] = S::Load(base + rows[i] + d);
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      const F qv = S::Load(q[h] + d);
#pragma GCC unroll 8
      for (int i = 0; i < P; ++i) acc[h][i] = S::Fma(qv, kv[i], acc[h][i]);
    }
  }
  if (t > 0) {
    F kv[P];
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) kv[i] = S::LoadTail(base + rows[i] + main, t);
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      const F qv = S::LoadTail(q[h] + main, t);
#pragma GCC unroll 8
      for (int i = 0; i < P; ++i) acc[h][i] = S::Fma(qv, kv[i], acc[h][i]);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < H; ++h) {
    float sums[P];
    if constexpr (P == 4) {
      S::ReduceAdd4(acc[h][0], acc[h][1], acc[h][2], acc[h][3], sums);
    } else {
#pragma GCC unroll 8
      for (int i = 0; i < P; ++i) sums[i] = S::ReduceAdd(acc[h][i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) {
      if constexpr (kKvQuantized<KT>) {
        s[h][i] = (sums[i] * row_scales[i]) * scale;
      } else {
        s[h][i] = sums[i] * scale;
      }
    }
  }
}

// Scores of P key rows for `slots` slots, slot h's at s[h] + off: four slots per tile where the
// registers allow (16 accumulators: each K vector loaded once for four slots), then two, then
// one. Every score's arithmetic is the same in any tile.
template <class S, class KT, int P>
void ScoresOfRows(const float* const* q, int64_t slots, int64_t hd, const KT* base,
                  const int64_t* rows, const float* row_scales, float scale, float* const* s,
                  int64_t off) {
  int64_t g = 0;
  auto tile = [&](auto h_const) {
    constexpr int H = decltype(h_const)::value;
    float* dst[H];
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) dst[h] = s[g + h] + off;
    ScoresTile<S, KT, P, H>(q + g, hd, base, rows, row_scales, scale, dst);
    g += H;
  };
  if constexpr (S::kAttnAccs >= 16) {
    while (g + 4 <= slots) tile(std::integral_constant<int, 4>());
  }
  while (g + 2 <= slots) tile(std::integral_constant<int, 2>());
  if (g < slots) tile(std::integral_constant<int, 1>());
}

// Bytes of K or V rows prefetched ahead of the position being processed (blocks are scattered,
// so the hardware prefetchers lose the stream at every block boundary).
inline constexpr int64_t kAttnPrefetchBytes = 4096;
// Bytes of V rows per chunk of the output pass (kept in L1 across the output tiles).
inline constexpr int64_t kAttnChunkBytes = 16384;

// Calls fn(j, row, rs) for j in [begin, end) ascending, row = element offset of position j's row:
// block_table[j / block_size] * block_stride + (j % block_size) * head_dim + extra, and rs = that
// row's scale for the quantized KV types (read at byte scale_extra + 4 * (j % block_size) of the
// block), 1 otherwise. Prefetches the rows some positions ahead.
template <class S, class KT, class Fn>
inline void ForEachPosition(const AttentionQuery& query, const PagedKvLayer& kv, int64_t begin,
                            int64_t end, int64_t extra, int64_t scale_extra, Fn&& fn) {
  const int64_t bs = kv.block_size, stride = BlockStride<S>(kv), hd = kv.head_dim;
  const int64_t row_bytes = hd * static_cast<int64_t>(sizeof(KT));
  const int64_t ahead =
      row_bytes > 0 && row_bytes < kAttnPrefetchBytes ? kAttnPrefetchBytes / row_bytes : 1;
  const char* base = static_cast<const char*>(kv.base);
  int64_t pj = begin + ahead, pblock = pj / bs, poff = pj % bs;  // prefetch cursor
  int64_t j = begin;
  while (j < end) {
    const int64_t off = j % bs;
    const int64_t count = bs - off < end - j ? bs - off : end - j;
    const int64_t block_start = query.block_table[j / bs] * stride;
    const int64_t row0 = block_start + off * hd + extra;
    const float* scales = nullptr;
    if constexpr (kKvQuantized<KT>) {
      scales = reinterpret_cast<const float*>(base + block_start + scale_extra) + off;
    }
    for (int64_t t = 0; t < count; ++t) {
      if (pj < end) {
        const char* r = base + (query.block_table[pblock] * stride + poff * hd + extra) *
                                   static_cast<int64_t>(sizeof(KT));
        for (int64_t b = 0; b < row_bytes; b += 64) S::Prefetch(r + b);
        ++pj;
        if (++poff == bs) {
          poff = 0;
          ++pblock;
        }
      }
      float rs = 1.0f;
      if constexpr (kKvQuantized<KT>) rs = scales[t];
      fn(j + t, row0 + t * hd, rs);
    }
    j += count;
  }
}

// Output of GT slots over NV vectors (+ a masked tail vector) of head_dim, for positions
// [j0, j1) of the span that starts at `begin`: o[g][d] accumulates p[g][j - begin] * v_j[d], one
// fma chain per (g, d) in ascending j, starting from +0 when `first`; then, when `mult` is given,
// the result is multiplied by mult[g] (1 / sum where slot g's chain ends here, else 1: x * 1 is
// x). The running sums live in o between calls (same values as in registers). Each V row is
// loaded once for the GT slots; o[g] points at the tile's first vector of slot g's output.
template <class S, class KT, int GT, int NV, bool kTail>
void AttentionOutputTile(const float* const* p, const AttentionQuery& query, const PagedKvLayer& kv,
                         int64_t begin, int64_t j0, int64_t j1, int64_t v_extra,
                         int64_t v_scale_extra, int tail, bool first, const float* mult,
                         float* const* o) {
  using F = typename S::F;
  constexpr int L = S::kLanes;
  constexpr int NA = NV > 0 ? NV : 1;
  F acc[GT][NA], acc_tail[GT];
  const float* pg[GT];
  float* og[GT];
#pragma GCC unroll 4
  for (int g = 0; g < GT; ++g) {
    pg[g] = p[g] - begin;
    og[g] = o[g];
    acc_tail[g] = first ? S::Zero() : S::LoadTail(og[g] + NV * L, tail);
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) acc[g][c] = first ? S::Zero() : S::Load(og[g] + c * L);
  }
  const KT* base = static_cast<const KT*>(kv.base);
  ForEachPosition<S, KT>(query, kv, j0, j1, v_extra, v_scale_extra,
                         [&](int64_t j, int64_t row, float rs) {
                           const KT* vp = base + row;
                           F v[NA], vt = S::Zero();
#pragma GCC unroll 8
                           for (int c = 0; c < NV; ++c) v[c] = S::Load(vp + c * L);
                           if constexpr (kTail) vt = S::LoadTail(vp + NV * L, tail);
#pragma GCC unroll 4
                           for (int g = 0; g < GT; ++g) {
                             // Quantized V: the row's scale folds into the probability (one
                             // rounding, same everywhere).
                             const F pv = S::Set1(kKvQuantized<KT> ? pg[g][j] * rs : pg[g][j]);
#pragma GCC unroll 8
                             for (int c = 0; c < NV; ++c) acc[g][c] = S::Fma(pv, v[c], acc[g][c]);
                             if constexpr (kTail) acc_tail[g] = S::Fma(pv, vt, acc_tail[g]);
                           }
                         });
#pragma GCC unroll 4
  for (int g = 0; g < GT; ++g) {
    const F iv = S::Set1(mult != nullptr ? mult[g] : 1.0f);
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) {
      S::Store(og[g] + c * L, mult != nullptr ? S::Mul(acc[g][c], iv) : acc[g][c]);
    }
    if constexpr (kTail) {
      S::StoreTail(og[g] + NV * L, mult != nullptr ? S::Mul(acc_tail[g], iv) : acc_tail[g], tail);
    }
  }
}

// Output tiles: at most kAttnMaxHeads slots and kAttnMaxVecs vectors (with the tail) per slot.
inline constexpr int kAttnMaxHeads = 4;
inline constexpr int kAttnMaxVecs = 8;

template <class KT>
using AttentionTileFn = void (*)(const float* const*, const AttentionQuery&, const PagedKvLayer&,
                                 int64_t, int64_t, int64_t, int64_t, int64_t, int, bool,
                                 const float*, float* const*);

// Vectors of head_dim an output tile of gt slots holds (the masked tail counts as one): the
// register budget OutputRange splits head_dim by.
template <class S>
constexpr int AttnTileBudget(int gt) {
  const int budget = S::kAttnAccs / gt;
  return budget > kAttnMaxVecs ? kAttnMaxVecs : (budget < 1 ? 1 : budget);
}

// The tile of gt slots and nv vectors (+ the tail), or nullptr for a shape OutputRange never
// asks for (over the budget): those are not instantiated, which keeps the ISA files' compile
// time down (the scalar file's four KV types took over two minutes with all 72 shapes each).
template <class S, class KT, int GT, int NV, bool kTail>
constexpr AttentionTileFn<KT> AttentionTileOrNull() {
  if constexpr (NV + (kTail ? 1 : 0) <= AttnTileBudget<S>(GT)) {
    return &AttentionOutputTile<S, KT, GT, NV, kTail>;
  } else {
    return nullptr;
  }
}

// Indexed ((gt - 1) * (kAttnMaxVecs + 1) + nv) * 2 + has_tail.
template <class S, class KT, size_t... I>
constexpr FnTable<S, AttentionTileFn<KT>, sizeof...(I)> MakeAttentionTiles(
    std::index_sequence<I...>) {
  return {{AttentionTileOrNull<S, KT, static_cast<int>(I / 2 / (kAttnMaxVecs + 1)) + 1,
                               static_cast<int>(I / 2 % (kAttnMaxVecs + 1)), (I % 2) == 1>()...}};
}

template <class S, class KT>
inline constexpr auto kAttentionTiles =
    MakeAttentionTiles<S, KT>(std::make_index_sequence<kAttnMaxHeads*(kAttnMaxVecs + 1) * 2>());

// Softmax of s[0, n) in place (p = exp(s - max)); returns 1 / sum(p).
template <class S>
float SoftmaxInPlace(float* s, int64_t n) {
  constexpr int L = S::kLanes;
  const int64_t main = n - n % L;
  // The maximum (any order gives the same value, up to the sign of a zero max, which no
  // exp(s - max) below can tell apart).
  float mx = s[0];
  if (main > 0) {
    typename S::F m = S::Load(s);
    for (int64_t i = L; i < main; i += L) m = S::MaxKeep(m, S::Load(s + i));
    float lanes[L];
    S::Store(lanes, m);
    for (int l = 0; l < L; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
  }
  for (int64_t i = main; i < n; ++i) mx = s[i] > mx ? s[i] : mx;
  const typename S::F mv = S::Set1(mx);
  typename S::F acc = S::Zero();
  for (int64_t i = 0; i < main; i += L) {
    typename S::F e = S::Exp(S::Sub(S::Load(s + i), mv));
    S::Store(s + i, e);
    acc = S::Add(acc, e);
  }
  if (main < n) {
    const int t = static_cast<int>(n - main);
    S::StoreTail(s + main, S::Exp(S::Sub(S::LoadTail(s + main, t), mv)), t);
    acc = S::Add(acc, S::LoadTail(s + main, t));
  }
  return 1.0f / S::ReduceAdd(acc);
}

// The slots of one work item: the `group` query heads that share kv head `kv_head`, of each of
// `count` queries; query r's slots are r * group ... r * group + group - 1. Scores of slot i at
// scratch + i * stride, 1 / sum of its probabilities at scratch + slots * stride + i.
template <class S>
struct AttentionSlots {
  const float* q;
  int64_t ldq;
  const AttentionQuery* queries;
  int64_t group, head0, hd;
  float* out;
  int64_t ldo;
  float* scratch;
  int64_t stride, slots;

  const AttentionQuery& query(int64_t i) const { return queries[i / group]; }
  const float* Q(int64_t i) const { return q + query(i).row * ldq + (head0 + i % group) * hd; }
  float* Out(int64_t i) const { return out + query(i).row * ldo + (head0 + i % group) * hd; }
  float* Scores(int64_t i) const { return scratch + i * stride; }
  float* Inv(int64_t i) const { return scratch + slots * stride + i; }
};

// Slots per pass over the key rows of ScoreRange (pointer arrays on the stack; a GQA group
// larger than this takes several passes).
inline constexpr int64_t kAttnScoreSlots = 64;

// Scores of key positions [jb, je) for slots [s0, s1), four positions at a time.
template <class S, class KT>
void ScoreRange(const AttentionSlots<S>& sl, const PagedKvLayer& kv, int64_t kv_head, int64_t begin,
                int64_t jb, int64_t je, int64_t s0, int64_t s1, float scale) {
  const KT* base = static_cast<const KT*>(kv.base);
  const int64_t k_extra = kv_head * kv.block_size * kv.head_dim;
  const int64_t k_scale_extra = KvScaleExtra<S>(kv, 0, kv_head);
  for (; s0 < s1; s0 += kAttnScoreSlots) {
    const int64_t n = s1 - s0 < kAttnScoreSlots ? s1 - s0 : kAttnScoreSlots;
    const float* qs[kAttnScoreSlots];
    float* ss[kAttnScoreSlots];
    for (int64_t i = 0; i < n; ++i) {
      qs[i] = sl.Q(s0 + i);
      ss[i] = sl.Scores(s0 + i);
    }
    int64_t rows[4], first_j = jb;
    float row_scales[4];
    int pending = 0;
    ForEachPosition<S, KT>(sl.query(s0), kv, jb, je, k_extra, k_scale_extra,
                           [&](int64_t j, int64_t row, float rs) {
                             if (pending == 0) first_j = j;
                             row_scales[pending] = rs;
                             rows[pending++] = row;
                             if (pending == 4) {
                               ScoresOfRows<S, KT, 4>(qs, n, sl.hd, base, rows, row_scales, scale,
                                                      ss, first_j - begin);
                               pending = 0;
                             }
                           });
    for (int i = 0; i < pending; ++i) {
      ScoresOfRows<S, KT, 1>(qs, n, sl.hd, base, rows + i, row_scales + i, scale, ss,
                             first_j - begin + i);
    }
  }
}

// Weighted sums of V over positions [jb, je) for slots [s0, s1), in chunks of positions small
// enough to stay in L1 while every slot and head_dim tile passes over them (each (slot, d) chain
// still runs over j in ascending order); a slot's sums are scaled by its 1 / sum in the chunk
// that ends at its query's context length.
template <class S, class KT>
void OutputRange(const AttentionSlots<S>& sl, const PagedKvLayer& kv, int64_t kv_head,
                 int64_t begin, int64_t jb, int64_t je, int64_t s0, int64_t s1) {
  constexpr int L = S::kLanes;
  const auto& tiles = kAttentionTiles<S, KT>;
  const int64_t hd = kv.head_dim;
  const int64_t v_extra = (kv.num_kv_heads + kv_head) * kv.block_size * hd;
  const int64_t v_scale_extra = KvScaleExtra<S>(kv, 1, kv_head);
  const int64_t full = hd / L;
  const int tail = static_cast<int>(hd % L);
  const int64_t row_bytes = hd * static_cast<int64_t>(sizeof(KT));
  const int64_t chunk = row_bytes < kAttnChunkBytes ? kAttnChunkBytes / row_bytes : 1;
  for (int64_t j0 = jb; j0 < je; j0 += chunk) {
    const int64_t j1 = je - j0 < chunk ? je : j0 + chunk;
    for (int64_t g0 = s0; g0 < s1; g0 += kAttnMaxHeads) {
      const int gt = static_cast<int>(s1 - g0 < kAttnMaxHeads ? s1 - g0 : kAttnMaxHeads);
      const float* ps[kAttnMaxHeads];
      float* outs[kAttnMaxHeads];
      float* os[kAttnMaxHeads];
      float mult[kAttnMaxHeads];
      bool ends = false;
      for (int g = 0; g < gt; ++g) {
        ps[g] = sl.Scores(g0 + g);
        outs[g] = sl.Out(g0 + g);
        const bool end = sl.query(g0 + g).context_len == j1;
        mult[g] = end ? *sl.Inv(g0 + g) : 1.0f;
        ends = ends || end;
      }
      // Vectors of head_dim per tile (the masked tail counts as one) within the register budget.
      const int budget = AttnTileBudget<S>(gt);
      int64_t c = 0;
      do {
        const int64_t left = full - c;
        const bool with_tail = tail > 0 && left + 1 <= budget;
        const int64_t nv = with_tail ? left : (left < budget ? left : budget);
        for (int g = 0; g < gt; ++g) os[g] = outs[g] + c * L;
        tiles.fn[((gt - 1) * (kAttnMaxVecs + 1) + nv) * 2 + (with_tail ? 1 : 0)](
            ps, sl.query(g0), kv, begin, j0, j1, v_extra + c * L, v_scale_extra,
            with_tail ? tail : 0, j0 == begin, ends ? mult : nullptr, os);
        c += nv;
        if (with_tail) break;
      } while (c < full || (c == full && tail > 0));
    }
  }
}

// One work item: kv head `kv_head` for `count` queries that share a block table, at context
// lengths c, c + 1, ..., c + count - 1 (consecutive positions of one sequence: a prefill chunk),
// with no sliding window shorter than c + count - 1 when count > 1. The positions before c are
// scored and summed for every slot at once (each K and V row loaded once for all of them), the
// few after it for the queries that reach them; every (query, head) pair's arithmetic is the
// one in the header comment, whatever the count.
template <class S, class KT>
void AttentionTyped(const float* q, int64_t ldq, const AttentionQuery* queries, int64_t count,
                    int64_t kv_head, int64_t group, const PagedKvLayer& kv, int64_t window,
                    float scale, float softcap, float* out, int64_t ldo, float* scratch) {
  const int64_t hd = kv.head_dim, ctx = queries[0].context_len;
  const int64_t begin = (window > 0 && ctx > window) ? ctx - window : 0;
  if (ctx <= begin) {  // an empty context (count is 1 then)
    float* oh = out + queries[0].row * ldo + kv_head * group * hd;
    for (int64_t i = 0; i < group * hd; ++i) oh[i] = 0.0f;
    return;
  }
  const int64_t slots = count * group;
  const AttentionSlots<S> sl{.q = q,
                             .ldq = ldq,
                             .queries = queries,
                             .group = group,
                             .head0 = kv_head * group,
                             .hd = hd,
                             .out = out,
                             .ldo = ldo,
                             .scratch = scratch,
                             .stride = queries[count - 1].context_len - begin,
                             .slots = slots};
  ScoreRange<S, KT>(sl, kv, kv_head, begin, begin, ctx, 0, slots, scale);
  for (int64_t r = 1; r < count; ++r) {
    ScoreRange<S, KT>(sl, kv, kv_head, begin, ctx, queries[r].context_len, r * group,
                      (r + 1) * group, scale);
  }
  if (softcap > 0.0f) {  // soft-capped scores (each on its own: batch-invariant)
    for (int64_t i = 0; i < slots; ++i) {
      float* sc = sl.Scores(i);
      const int64_t n = sl.query(i).context_len - begin;
      for (int64_t j = 0; j < n; ++j) sc[j] = softcap * std::tanh(sc[j] / softcap);
    }
  }
  for (int64_t i = 0; i < slots; ++i) {
    *sl.Inv(i) = SoftmaxInPlace<S>(sl.Scores(i), sl.query(i).context_len - begin);
  }
  OutputRange<S, KT>(sl, kv, kv_head, begin, begin, ctx, 0, slots);
  for (int64_t r = 1; r < count; ++r) {
    OutputRange<S, KT>(sl, kv, kv_head, begin, ctx, queries[r].context_len, r * group,
                       (r + 1) * group);
  }
}

template <class S>
void Attention(const float* q, int64_t ldq, const AttentionQuery* queries, int64_t count,
               int64_t kv_head, int64_t group, const PagedKvLayer& kv, int64_t window, float scale,
               float softcap, float* out, int64_t ldo, float* scratch) {
  if (kv.dtype == DType::kBF16) {
    AttentionTyped<S, uint16_t>(q, ldq, queries, count, kv_head, group, kv, window, scale, softcap,
                                out, ldo, scratch);
  } else if (kv.dtype == DType::kI8) {
    AttentionTyped<S, int8_t>(q, ldq, queries, count, kv_head, group, kv, window, scale, softcap,
                              out, ldo, scratch);
  } else if (kv.dtype == DType::kF8E4M3) {
    AttentionTyped<S, Fp8E4M3>(q, ldq, queries, count, kv_head, group, kv, window, scale, softcap,
                               out, ldo, scratch);
  } else {
    AttentionTyped<S, float>(q, ldq, queries, count, kv_head, group, kv, window, scale, softcap,
                             out, ldo, scratch);
  }
}

}  // namespace tandem::cpu::impl
