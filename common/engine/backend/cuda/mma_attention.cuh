#pragma once

// Paged attention of prefill tiles on tensor cores (FlashAttention-2 style), run by
// attention_kernels.cu's kernel for the tiles the plan marks (AttentionItem::path ==
// kAttentionPathMma) where the pool allows.
//
// Block (tile, kv head): the tile's rows r = token * group + g (at most 64, 16 per warp) hold q
// pre-scaled by 1 / sqrt(head_dim) and rounded to bf16, kept in registers as mma A fragments.
// Per chunk of 32 keys, K (row-major) and V (transposed) are staged into shared memory as bf16
// (dequantized from the pool with vector loads, kv_codes.cuh's values rounded to nearest even),
// then each warp, on its own 16 rows:
//   S = Q K^T          mma.sync m16n8k16 bf16 with f32 accumulators (dev::MmaBf16_16816);
//   mask               keys outside each row's causal / sliding-window range are -inf;
//   online softmax     row max over the quad of lanes holding the row, m' = max(m, max S),
//                      P = exp(S - m'), l = l exp(m - m') + rowsum P (each lane its columns),
//                      O = O exp(m - m');
//   O += P V           P rounded to bf16, reused from the S accumulators as A fragments.
// Output o / l (l summed over the quad) as the other paths: `out`, or the split partials.
//
// Arithmetic: bf16 inputs (q, K, V, P), exact products, f32 sums; the CPU's is f32 throughout,
// so results agree to about bf16 precision (tests: kAttentionMmaTolerance).

#include "common/engine/backend/cuda/attention_output.cuh"
#include "common/engine/backend/cuda/decode_attention.cuh"
#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/kv_codes.cuh"

namespace tandem::cuda::mma {

inline constexpr int kWarpRows = 16;  // rows of one warp (the mma's M)
inline constexpr int kKeys = 32;      // keys per chunk
inline constexpr int kMaxHeadDim = 128;
inline constexpr int kPad = 8;  // bf16 elements of padding per shared-memory row (banks)
inline constexpr float kNegInf = -__builtin_huge_valf();

// Whether tiles over `kv` can run here: head_dim a multiple of 16 up to 128, rows in aligned
// 8-element vectors.
TANDEM_HOST_DEVICE bool Supported(const KvLayerView& kv) {
  return kv.head_dim % 16 == 0 && kv.head_dim <= kMaxHeadDim && decode::Vectorizable(kv);
}

// Shared memory (4-byte words) of a tile of `rows` rows: Q [rows rounded to 16][hd + 8],
// K [32][hd + 8] and V^T [hd][32 + 8], bf16.
TANDEM_HOST_DEVICE int64_t SharedWords(int rows, int hd) {
  const int64_t rows16 = (rows + kWarpRows - 1) / kWarpRows * kWarpRows;
  return (rows16 * (hd + kPad) + static_cast<int64_t>(kKeys) * (hd + kPad) +
          static_cast<int64_t>(hd) * (kKeys + kPad) + 1) /
         2;
}

TANDEM_DEVICE uint32_t PackBf16(float lo, float hi) {
  return static_cast<uint32_t>(dev::FloatToBf16(lo)) |
         (static_cast<uint32_t>(dev::FloatToBf16(hi)) << 16);
}

TANDEM_DEVICE uint32_t LoadPair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

template <DType KD, class OT>
TANDEM_DEVICE void MmaTile(const AttentionArgs& a, const AttentionItem it, int kvh,
                           int32_t table_stride, float* sm) {
  const KvLayerView& kv = a.kv;
  const int hd = kv.head_dim, bs = kv.block_size;
  const int group = a.num_heads / kv.num_kv_heads;
  const int ntok = it.num_tokens, rows = ntok * group;
  const int rows16 = (rows + kWarpRows - 1) / kWarpRows * kWarpRows;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ldq = hd + kPad, ldk = hd + kPad, ldv = kKeys + kPad;
  uint16_t* qs = reinterpret_cast<uint16_t*>(sm);
  uint16_t* ks = qs + static_cast<int64_t>(rows16) * ldq;
  uint16_t* vt = ks + static_cast<int64_t>(kKeys) * ldk;
  const float scale = 1.0f / dev::Sqrt(static_cast<float>(hd));
  const int ksteps = hd / 16, dtiles = hd / 8, nv = hd / decode::kVec;

  for (int i = tid; i < rows16 * hd; i += nthreads) {
    const int r = i / hd, d = i % hd;
    float v = 0.0f;
    if (r < rows) {
      const int64_t tok = it.token_begin + r / group;
      const int h = kvh * group + r % group;
      v = a.q[tok * a.ldq + static_cast<int64_t>(h) * hd + d] * scale;
    }
    qs[r * ldq + d] = dev::FloatToBf16(v);
  }
  // This lane's two rows (g and g + 8 of the warp's 16) and their key ranges.
  int rb[2], re[2];
  for (int j = 0; j < 2; ++j) {
    const int r = warp * kWarpRows + g + 8 * j;
    rb[j] = re[j] = 0;
    if (r >= rows) continue;
    const int ctx = a.context_lens[it.token_begin + r / group];
    const int begin = (a.sliding_window > 0 && ctx > a.sliding_window) ? ctx - a.sliding_window : 0;
    rb[j] = begin > it.kv_begin ? begin : it.kv_begin;
    re[j] = ctx < it.kv_end ? ctx : it.kv_end;
  }
  // Key range of the whole tile (the union of its rows' ranges).
  int lo = it.kv_end, hi = it.kv_begin;
  for (int i = 0; i < ntok; ++i) {
    const int ctx = a.context_lens[it.token_begin + i];
    const int begin = (a.sliding_window > 0 && ctx > a.sliding_window) ? ctx - a.sliding_window : 0;
    if (ctx <= begin) continue;
    lo = begin < lo ? begin : lo;
    hi = ctx > hi ? ctx : hi;
  }
  lo = lo > it.kv_begin ? lo : it.kv_begin;
  hi = hi < it.kv_end ? hi : it.kv_end;
  dev::SyncThreads();

  const bool active = warp * kWarpRows < rows;  // warp-uniform
  uint32_t qf[kMaxHeadDim / 16][4];
  TANDEM_UNROLL
  for (int kk = 0; kk < kMaxHeadDim / 16; ++kk) {
    qf[kk][0] = qf[kk][1] = qf[kk][2] = qf[kk][3] = 0;
    if (kk >= ksteps || !active) continue;
    const uint16_t* base = qs + (warp * kWarpRows + g) * ldq + kk * 16 + 2 * t;
    qf[kk][0] = LoadPair(base);
    qf[kk][1] = LoadPair(base + 8 * ldq);
    qf[kk][2] = LoadPair(base + 8);
    qf[kk][3] = LoadPair(base + 8 * ldq + 8);
  }
  float o[kMaxHeadDim / 8][4];
  TANDEM_UNROLL
  for (int dt = 0; dt < kMaxHeadDim / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};

  const int32_t* table = a.block_tables + static_cast<int64_t>(it.table_row) * table_stride;
  const int64_t block_bytes = dev::KvBlockBytes(kv);
  const int64_t code_bytes = dev::KvCodeBytes(KD);
  const int64_t k_row0 = dev::KvRow(kv, 0, kvh, 0), v_row0 = dev::KvRow(kv, 1, kvh, 0);

  for (int c0 = lo; c0 < hi; c0 += kKeys) {
    const int n = hi - c0 < kKeys ? hi - c0 : kKeys;
    // Stage K and V^T of the chunk as bf16 (zeros past the range).
    for (int i = tid; i < kKeys * nv; i += nthreads) {
      const int j = i / nv, vi = i % nv;
      float x[decode::kVec], y[decode::kVec];
      for (int e = 0; e < decode::kVec; ++e) x[e] = y[e] = 0.0f;
      if (j < n) {
        const int pos = c0 + j;
        const uint8_t* block = dev::KvBlockAt(kv, table[pos / bs], block_bytes);
        const int64_t off = pos % bs;
        decode::KvVec<KD> kr, vr;
        kr.Load(block + ((k_row0 + off) * hd + vi * decode::kVec) * code_bytes);
        vr.Load(block + ((v_row0 + off) * hd + vi * decode::kVec) * code_bytes);
        float ksc = 0.0f, vsc = 0.0f;
        if constexpr (KD == DType::kI8 || KD == DType::kF8E4M3) {
          ksc = *reinterpret_cast<const float*>(block + dev::KvScaleOffset(kv, k_row0 + off));
          vsc = *reinterpret_cast<const float*>(block + dev::KvScaleOffset(kv, v_row0 + off));
        }
        kr.Get(x, ksc);
        vr.Get(y, vsc);
      }
      uint32_t* krow = reinterpret_cast<uint32_t*>(ks + j * ldk + vi * decode::kVec);
      for (int e = 0; e < decode::kVec; e += 2) krow[e / 2] = PackBf16(x[e], x[e + 1]);
      for (int e = 0; e < decode::kVec; ++e) {
        vt[(vi * decode::kVec + e) * ldv + j] = dev::FloatToBf16(y[e]);
      }
    }
    dev::SyncThreads();
    if (active) {
      float s[kKeys / 8][4];
      TANDEM_UNROLL
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        const uint16_t* kb = ks + (nt * 8 + g) * ldk + 2 * t;
        TANDEM_UNROLL
        for (int kk = 0; kk < kMaxHeadDim / 16; ++kk) {
          if (kk >= ksteps) break;
          const uint32_t b[2] = {LoadPair(kb + kk * 16), LoadPair(kb + kk * 16 + 8)};
          dev::MmaBf16_16816(s[nt], qf[kk], b);
        }
      }
      // Mask, row max over the quad, online softmax.
      float mx[2] = {m[0], m[1]};
      TANDEM_UNROLL
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        TANDEM_UNROLL
        for (int i = 0; i < 4; ++i) {
          const int j = i >> 1, key = c0 + nt * 8 + 2 * t + (i & 1);
          const bool seen = key < c0 + n && key >= rb[j] && key < re[j];
          s[nt][i] = seen ? s[nt][i] : kNegInf;
          mx[j] = s[nt][i] > mx[j] ? s[nt][i] : mx[j];
        }
      }
      float corr[2], sum[2] = {0.0f, 0.0f};
      TANDEM_UNROLL
      for (int j = 0; j < 2; ++j) {
        float other = dev::ShflXor(mx[j], 1);
        mx[j] = other > mx[j] ? other : mx[j];
        other = dev::ShflXor(mx[j], 2);
        mx[j] = other > mx[j] ? other : mx[j];
        corr[j] = mx[j] == kNegInf ? 1.0f : dev::Exp(m[j] - mx[j]);  // 0 at the first key
        m[j] = mx[j];
      }
      TANDEM_UNROLL
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        TANDEM_UNROLL
        for (int i = 0; i < 4; ++i) {
          const int j = i >> 1;
          const float p = m[j] == kNegInf ? 0.0f : dev::Exp(s[nt][i] - m[j]);
          s[nt][i] = p;
          sum[j] += p;
        }
      }
      l[0] = l[0] * corr[0] + sum[0];
      l[1] = l[1] * corr[1] + sum[1];
      TANDEM_UNROLL
      for (int dt = 0; dt < kMaxHeadDim / 8; ++dt) {
        o[dt][0] *= corr[0];
        o[dt][1] *= corr[0];
        o[dt][2] *= corr[1];
        o[dt][3] *= corr[1];
      }
      TANDEM_UNROLL
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t pa[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]),
                                PackBf16(s[2 * kk][2], s[2 * kk][3]),
                                PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        TANDEM_UNROLL
        for (int dt = 0; dt < kMaxHeadDim / 8; ++dt) {
          if (dt >= dtiles) break;
          const uint16_t* vb = vt + (dt * 8 + g) * ldv + kk * 16 + 2 * t;
          const uint32_t b[2] = {LoadPair(vb), LoadPair(vb + 8)};
          dev::MmaBf16_16816(o[dt], pa, b);
        }
      }
    }
    dev::SyncThreads();  // the next chunk overwrites K and V
  }

  // Row sums over the quad, then o / l.
  TANDEM_UNROLL
  for (int j = 0; j < 2; ++j) {
    l[j] += dev::ShflXor(l[j], 1);
    l[j] += dev::ShflXor(l[j], 2);
  }
  for (int j = 0; j < 2; ++j) {
    const int r = warp * kWarpRows + g + 8 * j;
    if (r >= rows) continue;
    const int tl = r / group;
    const int h = kvh * group + r % group;
    TANDEM_UNROLL
    for (int dt = 0; dt < kMaxHeadDim / 8; ++dt) {
      if (dt >= dtiles) break;
      for (int i = 0; i < 2; ++i) {
        const int d = dt * 8 + 2 * t + i;
        StoreAttentionValue<OT>(a, it, tl, h, d, l[j] > 0.0f ? o[dt][2 * j + i] / l[j] : 0.0f, m[j],
                                l[j]);
      }
    }
  }
}

// Runs tile `it` on tensor cores when the plan asks and the pool and shared memory allow; false:
// run it on the SIMT tile kernel.
template <DType KD, class OT>
TANDEM_DEVICE bool TryMmaTile(const AttentionArgs& a, const AttentionItem it, int kvh,
                              int32_t table_stride, float* sm, int64_t smem_words) {
  if (it.path != kAttentionPathMma || !Supported(a.kv)) return false;
  const int rows = it.num_tokens * (a.num_heads / a.kv.num_kv_heads);
  if (rows > kWarpRows * static_cast<int>(blockDim.x >> 5)) return false;
  if (SharedWords(rows, a.kv.head_dim) > smem_words) return false;
  MmaTile<KD, OT>(a, it, kvh, table_stride, sm);
  return true;
}

}  // namespace tandem::cuda::mma
