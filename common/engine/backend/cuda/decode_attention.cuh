#pragma once

// Paged attention of decode items (AttentionItem::path kAttentionPathDecode: one or a few query
// tokens of one sequence, at most kAttentionDecodeRows rows = tokens x the kv head's group of query
// heads), run by attention_kernels.cu's kernel for the items the plan marks.
//
// The block (item, kv head) reads each K and V row of its key range once for all of its rows:
//   * the item's block-table entries are staged into shared memory once (in spans of up to
//     `table_cap` blocks), so a key's block is a shared-memory read, not a global one per element;
//   * lane `dl` of a group of `width` lanes (width = head_dim / 8 rounded up to a power of two)
//     holds elements [8 dl, 8 dl + 8) of a row, read as one 128-bit load (bf16), two (f32) or one
//     64-bit load (int8, fp8 with the row's scale), so a warp reads 32 / width keys side by side,
//     kDecodeSteps of them per lane in flight (K and V issued together);
//   * a score is the lane group's sum of its lanes' partial dot products (WarpSumGroups, every
//     score of a step in one butterfly), q pre-scaled by 1 / sqrt(head_dim) in registers;
//   * every lane keeps its own online softmax (max m, sum l, output o of its 8 elements) per row
//     over the keys it reads, so the key loop has no block barrier and no cross-lane traffic but
//     the score sums; the states are merged at the end: across the lane groups of a warp by xor
//     shuffles, across the warps through shared memory (weights l exp(m - max m)).
// Each row masks keys outside its own causal / sliding-window range. Output as the tile kernel's:
// o / l to `out`, or (o / l, m, l) to the split partials for MergeSplitsKernel.

#include "common/engine/backend/cuda/attention_output.cuh"
#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/kv_codes.cuh"

namespace tandem::cuda::decode {

inline constexpr int kVec = 8;    // elements of a K/V row per lane
inline constexpr int kSteps = 4;  // keys per lane per warp step (loads in flight)
inline constexpr float kNegInf = -__builtin_huge_valf();

// Whether the decode path can read the pool `kv` with its vector loads: whole 8-element vectors
// per row (head_dim % 8 == 0, at most 32 lanes), and every row aligned to its load size (the
// remote pool's too, KvLayerView::remote_base).
TANDEM_HOST_DEVICE bool Vectorizable(const KvLayerView& kv) {
  if (kv.head_dim <= 0 || kv.head_dim % kVec != 0 || kv.head_dim > 32 * kVec) return false;
  const uint64_t align = dev::KvCodeBytes(kv.dtype) == 1 ? 8 : 16;
  return reinterpret_cast<uintptr_t>(kv.base) % align == 0 &&
         reinterpret_cast<uintptr_t>(kv.remote_base) % align == 0 &&
         static_cast<uint64_t>(dev::KvBlockBytes(kv)) % align == 0;
}

// Shared memory (4-byte words) of a decode item of `rows` rows besides its block-table span.
TANDEM_HOST_DEVICE int64_t MergeWords(int rows, int head_dim, int warps) {
  return static_cast<int64_t>(warps) * rows * (head_dim + 2);
}

// Eight consecutive elements of a K or V row as loaded (the codes), and their f32 values.
template <DType KD>
struct KvVec;

template <>
struct KvVec<DType::kF32> {
  dev::U32x4 a, b;
  TANDEM_DEVICE void Load(const uint8_t* p) {
    a = dev::Load16(p);
    b = dev::Load16(p + 16);
  }
  TANDEM_DEVICE void Zero() { a = b = dev::U32x4{0, 0, 0, 0}; }
  TANDEM_DEVICE void Get(float (&x)[kVec], float) const {
    x[0] = dev::BitsToFloat(a.x);
    x[1] = dev::BitsToFloat(a.y);
    x[2] = dev::BitsToFloat(a.z);
    x[3] = dev::BitsToFloat(a.w);
    x[4] = dev::BitsToFloat(b.x);
    x[5] = dev::BitsToFloat(b.y);
    x[6] = dev::BitsToFloat(b.z);
    x[7] = dev::BitsToFloat(b.w);
  }
};

template <>
struct KvVec<DType::kBF16> {
  dev::U32x4 a;
  TANDEM_DEVICE void Load(const uint8_t* p) { a = dev::Load16(p); }
  TANDEM_DEVICE void Zero() { a = dev::U32x4{0, 0, 0, 0}; }
  TANDEM_DEVICE static void Pair(uint32_t w, float* x) {  // little endian: element 0 low
    x[0] = dev::BitsToFloat(w << 16);
    x[1] = dev::BitsToFloat(w & 0xffff0000u);
  }
  TANDEM_DEVICE void Get(float (&x)[kVec], float) const {
    Pair(a.x, x);
    Pair(a.y, x + 2);
    Pair(a.z, x + 4);
    Pair(a.w, x + 6);
  }
};

template <DType KD>
struct KvVec8Bit {
  dev::U32x2 a;
  TANDEM_DEVICE void Load(const uint8_t* p) { a = dev::Load8(p); }
  TANDEM_DEVICE void Zero() { a = dev::U32x2{0, 0}; }
  TANDEM_DEVICE void Get(float (&x)[kVec], float scale) const {
    TANDEM_UNROLL
    for (int e = 0; e < kVec; ++e) {
      const uint32_t w = e < 4 ? a.x : a.y;
      const uint8_t c = static_cast<uint8_t>(w >> (8 * (e & 3)));
      if constexpr (KD == DType::kI8) {
        x[e] = static_cast<float>(static_cast<int8_t>(c)) * scale;  // LoadKv's product
      } else {
        x[e] = dev::Fp8E4M3ToFloatScaled(c) * scale;
      }
    }
  }
};

template <>
struct KvVec<DType::kI8> : KvVec8Bit<DType::kI8> {};
template <>
struct KvVec<DType::kF8E4M3> : KvVec8Bit<DType::kF8E4M3> {};

// One decode item (see the file comment) with at most R rows; `sm` holds `smem_words` words.
template <DType KD, class OT, int R>
TANDEM_DEVICE void DecodeItem(const AttentionArgs& a, const AttentionItem it, int kvh,
                              int32_t table_stride, float* sm, int64_t smem_words) {
  const KvLayerView& kv = a.kv;
  const int hd = kv.head_dim, bs = kv.block_size;
  const int group = a.num_heads / kv.num_kv_heads;
  const int rows = it.num_tokens * group;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, warps = nthreads >> 5;
  const int nv = hd / kVec;
  int width = 1;
  while (width < nv) width <<= 1;
  const int side = 32 / width;  // keys a warp reads side by side
  const int sub = lane / width, dl = lane % width;
  const bool has_dims = dl < nv;
  const int d0 = dl * kVec;
  const float scale = 1.0f / dev::Sqrt(static_cast<float>(hd));

  float* merge_o = sm;                                             // [warps][rows][hd]
  float* merge_ml = sm + static_cast<int64_t>(warps) * rows * hd;  // [warps][rows][2]
  int32_t* span = reinterpret_cast<int32_t*>(sm + MergeWords(rows, hd, warps));
  int64_t table_cap = smem_words - MergeWords(rows, hd, warps);
  if (a.decode_table_span > 0 && a.decode_table_span < table_cap) table_cap = a.decode_table_span;

  // Rows: q (pre-scaled) elements [d0, d0 + 8) and the key range [rb, re) of each.
  float q[R][kVec];
  int rb[R], re[R];
  int lo = it.kv_end, hi = it.kv_begin;
  TANDEM_UNROLL
  for (int r = 0; r < R; ++r) {
    rb[r] = re[r] = 0;
    TANDEM_UNROLL
    for (int e = 0; e < kVec; ++e) q[r][e] = 0.0f;
    if (r >= rows) continue;
    const int64_t t = it.token_begin + r / group;
    const int h = kvh * group + r % group;
    if (has_dims) {
      const float* qr = a.q + t * a.ldq + static_cast<int64_t>(h) * hd + d0;
      TANDEM_UNROLL
      for (int e = 0; e < kVec; ++e) q[r][e] = qr[e] * scale;
    }
    const int ctx = a.context_lens[t];
    const int begin = (a.sliding_window > 0 && ctx > a.sliding_window) ? ctx - a.sliding_window : 0;
    rb[r] = begin > it.kv_begin ? begin : it.kv_begin;
    re[r] = ctx < it.kv_end ? ctx : it.kv_end;
    if (re[r] <= rb[r]) continue;
    lo = rb[r] < lo ? rb[r] : lo;
    hi = re[r] > hi ? re[r] : hi;
  }

  float m[R], l[R], o[R][kVec];
  TANDEM_UNROLL
  for (int r = 0; r < R; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
    TANDEM_UNROLL
    for (int e = 0; e < kVec; ++e) o[r][e] = 0.0f;
  }

  const int32_t* table = a.block_tables + static_cast<int64_t>(it.table_row) * table_stride;
  const int64_t block_bytes = dev::KvBlockBytes(kv);
  const int64_t code_bytes = dev::KvCodeBytes(KD);
  const int64_t k_row0 = dev::KvRow(kv, 0, kvh, 0), v_row0 = dev::KvRow(kv, 1, kvh, 0);
  const int step = side * kSteps;  // keys of one warp step

  for (int k0 = lo; k0 < hi;) {
    // Stage the block-table entries of keys [k0, k1).
    const int b0 = k0 / bs;
    const int64_t span_end = (static_cast<int64_t>(b0) + table_cap) * bs;
    const int k1 = span_end < hi ? static_cast<int>(span_end) : hi;
    const int nb = (k1 - 1) / bs - b0 + 1;
    for (int i = tid; i < nb; i += nthreads) span[i] = table[b0 + i];
    dev::SyncThreads();

    for (int base = k0 + warp * step; base < k1; base += warps * step) {
      KvVec<KD> kr[kSteps], vr[kSteps];
      float ksc[kSteps], vsc[kSteps];
      int pos[kSteps];
      TANDEM_UNROLL
      for (int c = 0; c < kSteps; ++c) {
        pos[c] = base + c * side + sub;
        ksc[c] = vsc[c] = 0.0f;
        if (pos[c] < k1 && has_dims) {
          const uint8_t* block = dev::KvBlockAt(kv, span[pos[c] / bs - b0], block_bytes);
          const int64_t off = pos[c] % bs;
          kr[c].Load(block + ((k_row0 + off) * hd + d0) * code_bytes);
          vr[c].Load(block + ((v_row0 + off) * hd + d0) * code_bytes);
          if constexpr (KD == DType::kI8 || KD == DType::kF8E4M3) {
            ksc[c] = *reinterpret_cast<const float*>(block + dev::KvScaleOffset(kv, k_row0 + off));
            vsc[c] = *reinterpret_cast<const float*>(block + dev::KvScaleOffset(kv, v_row0 + off));
          }
        } else {
          kr[c].Zero();
          vr[c].Zero();
        }
      }
      // Scores s[c * R + r] of this lane group's keys.
      float s[kSteps * R];
      TANDEM_UNROLL
      for (int c = 0; c < kSteps; ++c) {
        float kx[kVec];
        kr[c].Get(kx, ksc[c]);
        TANDEM_UNROLL
        for (int r = 0; r < R; ++r) {
          float acc = 0.0f;
          TANDEM_UNROLL
          for (int e = 0; e < kVec; ++e) acc += q[r][e] * kx[e];
          s[c * R + r] = acc;
        }
      }
      dev::WarpSumGroups(s, width);
      // Online softmax of each row over this lane's keys of the step, then the V products.
      TANDEM_UNROLL
      for (int r = 0; r < R; ++r) {
        float mx = m[r];
        TANDEM_UNROLL
        for (int c = 0; c < kSteps; ++c) {
          const bool seen = pos[c] < k1 && pos[c] >= rb[r] && pos[c] < re[r];
          s[c * R + r] = seen ? s[c * R + r] : kNegInf;
          mx = s[c * R + r] > mx ? s[c * R + r] : mx;
        }
        if (mx == kNegInf) continue;             // nothing visible to this lane yet
        const float corr = dev::Exp(m[r] - mx);  // 0 for the first visible key
        m[r] = mx;
        l[r] *= corr;
        TANDEM_UNROLL
        for (int e = 0; e < kVec; ++e) o[r][e] *= corr;
        TANDEM_UNROLL
        for (int c = 0; c < kSteps; ++c) {
          const float p = dev::Exp(s[c * R + r] - mx);
          s[c * R + r] = p;
          l[r] += p;
        }
      }
      TANDEM_UNROLL
      for (int c = 0; c < kSteps; ++c) {
        float vx[kVec];
        vr[c].Get(vx, vsc[c]);
        TANDEM_UNROLL
        for (int r = 0; r < R; ++r) {
          const float p = m[r] == kNegInf ? 0.0f : s[c * R + r];
          TANDEM_UNROLL
          for (int e = 0; e < kVec; ++e) o[r][e] += p * vx[e];
        }
      }
    }
    dev::SyncThreads();  // the next span overwrites the staged entries
    k0 = k1;
  }

  // Merge the lane groups of the warp (same elements, other keys).
  for (int mask = width; mask < 32; mask <<= 1) {
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      float mine[kVec + 2], other[kVec + 2];  // m, l, o of the row
      mine[0] = m[r];
      mine[1] = l[r];
      TANDEM_UNROLL
      for (int e = 0; e < kVec; ++e) mine[2 + e] = o[r][e];
      dev::ShflXorN(mine, other, mask);
      const float mo = other[0], lo_other = other[1];
      const float* oo = other + 2;
      const float mx = mo > m[r] ? mo : m[r];
      if (mx == kNegInf) continue;
      const float ca = dev::Exp(m[r] - mx), cb = dev::Exp(mo - mx);
      m[r] = mx;
      l[r] = l[r] * ca + lo_other * cb;
      TANDEM_UNROLL
      for (int e = 0; e < kVec; ++e) o[r][e] = o[r][e] * ca + oo[e] * cb;
    }
  }
  if (sub == 0) {
    TANDEM_UNROLL
    for (int r = 0; r < R; ++r) {
      if (r >= rows) continue;
      const int64_t cell = static_cast<int64_t>(warp) * rows + r;
      if (has_dims) {
        TANDEM_UNROLL
        for (int e = 0; e < kVec; ++e) merge_o[cell * hd + d0 + e] = o[r][e];
      }
      if (lane == 0) {
        merge_ml[cell * 2] = m[r];
        merge_ml[cell * 2 + 1] = l[r];
      }
    }
  }
  dev::SyncThreads();

  // Merge the warps and write.
  for (int i = tid; i < rows * hd; i += nthreads) {
    const int r = i / hd, d = i % hd;
    float mx = kNegInf;
    for (int w = 0; w < warps; ++w) {
      const float mw = merge_ml[(static_cast<int64_t>(w) * rows + r) * 2];
      mx = mw > mx ? mw : mx;
    }
    float num = 0.0f, den = 0.0f;
    if (mx != kNegInf) {
      for (int w = 0; w < warps; ++w) {
        const int64_t cell = static_cast<int64_t>(w) * rows + r;
        const float mw = merge_ml[cell * 2];
        if (mw == kNegInf) continue;
        const float c = dev::Exp(mw - mx);
        num += merge_o[cell * hd + d] * c;
        den += merge_ml[cell * 2 + 1] * c;
      }
    }
    StoreAttentionValue<OT>(a, it, r / group, kvh * group + r % group, d,
                            den > 0.0f ? num / den : 0.0f, mx, den);
  }
}

// Runs item `it` by DecodeItem when the pool and shared memory allow; false: run it as a tile.
template <DType KD, class OT>
TANDEM_DEVICE bool TryDecodeItem(const AttentionArgs& a, const AttentionItem it, int kvh,
                                 int32_t table_stride, float* sm, int64_t smem_words) {
  const int rows = it.num_tokens * (a.num_heads / a.kv.num_kv_heads);
  if (it.path != kAttentionPathDecode || rows > kAttentionDecodeRows || !Vectorizable(a.kv))
    return false;
  // At least one block's entries besides the merge area.
  if (smem_words - MergeWords(rows, a.kv.head_dim, blockDim.x >> 5) < 1) return false;
  if (rows <= 1) {
    DecodeItem<KD, OT, 1>(a, it, kvh, table_stride, sm, smem_words);
  } else if (rows <= 2) {
    DecodeItem<KD, OT, 2>(a, it, kvh, table_stride, sm, smem_words);
  } else if (rows <= 4) {
    DecodeItem<KD, OT, 4>(a, it, kvh, table_stride, sm, smem_words);
  } else {
    DecodeItem<KD, OT, kAttentionDecodeRows>(a, it, kvh, table_stride, sm, smem_words);
  }
  return true;
}

}  // namespace tandem::cuda::decode
