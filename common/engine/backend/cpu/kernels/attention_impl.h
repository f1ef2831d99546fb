#pragma once

// Paged KV cache writes/reads and paged attention as templates over an ISA's Simd type. Only
// templates live here (see matmul_impl.h).
//
// Arithmetic of one (query, head) pair, the same in every batch and thread partition:
//   span = [start, L) with start = max(0, L - window) when window > 0;
//   s[j] = ReduceAdd(lane-wise fma over head_dim, zero-padded tail)(q, k_j) * scale, j ascending;
//   mx = max_j s[j];  p[j] = Exp(s[j] - mx) in vectors of kLanes from `start`;
//   sum = ReduceAdd(lane-wise sum of the p vectors, zero-padded tail);
//   out[d] = (sum_j p[j] * v_j[d], fma chain over j ascending from +0) * (1 / sum).

#include <array>
#include <cstdint>
#include <utility>

#include "common/base/dtype.h"
#include "common/engine/backend/cpu/kernels/elementwise_impl.h"
#include "common/engine/backend/cpu/kernels/kernels.h"

namespace tandem::cpu::impl {

// Offset (in elements) of a slot's K (which = 0) or V (which = 1) row of kv head h.
template <class S>
inline int64_t KvRowOffset(const PagedKvLayer& kv, int64_t slot, int which, int64_t h) {
  const int64_t block = slot / kv.block_size, off = slot % kv.block_size;
  return block * kv.block_stride_elems() +
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
        if (kv.dtype == DType::kBF16) {
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
    if (kv.dtype == DType::kBF16) {
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

// Calls fn(j, row) for j in [begin, end) ascending, row = element offset of position j's row
// within its block (block_table[j / block_size] * block_stride), plus `extra`.
template <class S, class Fn>
inline void ForEachPosition(const AttentionQuery& query, const PagedKvLayer& kv, int64_t begin,
                            int64_t end, int64_t extra, Fn&& fn) {
  const int64_t bs = kv.block_size, stride = kv.block_stride_elems();
  int64_t j = begin;
  while (j < end) {
    const int64_t off = j % bs;
    const int64_t count = bs - off < end - j ? bs - off : end - j;
    const int64_t row0 = query.block_table[j / bs] * stride + off * kv.head_dim + extra;
    for (int64_t t = 0; t < count; ++t) fn(j + t, row0 + t * kv.head_dim);
    j += count;
  }
}

// o[d0 .. d0 + NV*L + tail) = (sum_j p[j - begin] v_j[...]) * inv, j ascending.
template <class S, class KT, int NV, bool kTail>
void AttentionOutputTile(const float* p, const AttentionQuery& query, const PagedKvLayer& kv,
                         int64_t begin, int64_t end, int64_t v_extra, int tail, float inv,
                         float* o) {
  using F = typename S::F;
  constexpr int L = S::kLanes;
  F acc[NV > 0 ? NV : 1];
  F acc_tail = S::Zero();
#pragma GCC unroll 16
  for (int c = 0; c < NV; ++c) acc[c] = S::Zero();
  const KT* base = static_cast<const KT*>(kv.base);
  ForEachPosition<S>(query, kv, begin, end, v_extra, [&](int64_t j, int64_t row) {
    const F pv = S::Set1(p[j - begin]);
    const KT* vp = base + row;
#pragma GCC unroll 16
    for (int c = 0; c < NV; ++c) acc[c] = S::Fma(pv, S::Load(vp + c * L), acc[c]);
    if constexpr (kTail) acc_tail = S::Fma(pv, S::LoadTail(vp + NV * L, tail), acc_tail);
  });
  const F iv = S::Set1(inv);
#pragma GCC unroll 16
  for (int c = 0; c < NV; ++c) S::Store(o + c * L, S::Mul(acc[c], iv));
  if constexpr (kTail) S::StoreTail(o + NV * L, S::Mul(acc_tail, iv), tail);
}

template <class S, class KT>
using AttentionTileFn = void (*)(const float*, const AttentionQuery&, const PagedKvLayer&, int64_t,
                                 int64_t, int64_t, int, float, float*);

// Indexed [nv * 2 + has_tail] for nv in 0..kAttnVecs.
template <class S, class KT, size_t... I>
constexpr std::array<AttentionTileFn<S, KT>, sizeof...(I)> MakeAttentionTiles(
    std::index_sequence<I...>) {
  return {{&AttentionOutputTile<S, KT, static_cast<int>(I / 2), (I % 2) == 1>...}};
}

template <class S, class KT>
inline constexpr auto kAttentionTiles =
    MakeAttentionTiles<S, KT>(std::make_index_sequence<2 * (S::kAttnVecs + 1)>());

// Softmax of s[0, n) in place (p = exp(s - max)); returns 1 / sum(p).
template <class S>
float SoftmaxInPlace(float* s, int64_t n) {
  constexpr int L = S::kLanes;
  float mx = s[0];
  for (int64_t i = 1; i < n; ++i) mx = s[i] > mx ? s[i] : mx;
  const typename S::F mv = S::Set1(mx);
  typename S::F acc = S::Zero();
  const int64_t main = n - n % L;
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

template <class S, class KT>
void AttentionTyped(const float* q, int64_t ldq, const AttentionQuery& query, int64_t kv_head,
                    int64_t group, const PagedKvLayer& kv, int64_t window, float scale, float* out,
                    int64_t ldo, float* scratch) {
  constexpr int L = S::kLanes;
  const int64_t hd = kv.head_dim, ctx = query.context_len;
  const int64_t begin = (window > 0 && ctx > window) ? ctx - window : 0;
  const int64_t n = ctx > begin ? ctx - begin : 0;
  const float* qh = q + query.row * ldq + kv_head * group * hd;
  float* oh = out + query.row * ldo + kv_head * group * hd;
  if (n == 0) {
    for (int64_t i = 0; i < group * hd; ++i) oh[i] = 0.0f;
    return;
  }
  const KT* base = static_cast<const KT*>(kv.base);
  const int64_t k_extra = kv_head * kv.block_size * hd;
  const int64_t v_extra = (kv.num_kv_heads + kv_head) * kv.block_size * hd;
  // Scores of every head of the group; each key row is loaded once for the group.
  ForEachPosition<S>(query, kv, begin, ctx, k_extra, [&](int64_t j, int64_t row) {
    for (int64_t g = 0; g < group; ++g) {
      scratch[g * n + (j - begin)] = Dot<S>(qh + g * hd, base + row, hd) * scale;
    }
  });
  const auto& tiles = kAttentionTiles<S, KT>;
  const int64_t full = hd / L;
  const int tail = static_cast<int>(hd % L);
  for (int64_t g = 0; g < group; ++g) {
    float* p = scratch + g * n;
    const float inv = SoftmaxInPlace<S>(p, n);
    // Tiles of up to kAttnVecs vectors of head_dim; the last one also takes the masked tail.
    int64_t c = 0;
    do {
      const int64_t nv = full - c < S::kAttnVecs ? full - c : S::kAttnVecs;
      const bool with_tail = tail > 0 && c + nv == full;
      tiles[nv * 2 + (with_tail ? 1 : 0)](p, query, kv, begin, ctx, v_extra + c * L,
                                          with_tail ? tail : 0, inv, oh + g * hd + c * L);
      c += nv;
    } while (c < full);
  }
}

template <class S>
void Attention(const float* q, int64_t ldq, const AttentionQuery& query, int64_t kv_head,
               int64_t group, const PagedKvLayer& kv, int64_t window, float scale, float* out,
               int64_t ldo, float* scratch) {
  if (kv.dtype == DType::kBF16) {
    AttentionTyped<S, uint16_t>(q, ldq, query, kv_head, group, kv, window, scale, out, ldo,
                                scratch);
  } else {
    AttentionTyped<S, float>(q, ldq, query, kv_head, group, kv, window, scale, out, ldo, scratch);
  }
}

}  // namespace tandem::cpu::impl
