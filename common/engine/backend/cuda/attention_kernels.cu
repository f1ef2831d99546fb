// Paged attention: one kernel for prefill tiles and decode tokens (flash-style online softmax over
// key chunks staged in shared memory), plus the merge of key-range splits (flash-decoding). Each
// item runs on the path the plan chose (AttentionItem::path) where the pool allows it: decode
// items on decode_attention.cuh, tensor-core tiles on mma_attention.cuh, else the fp32 SIMT tile
// below.
//
// The SIMT tile: block (item, kv_head) holds the tile's rows r = token * group + g (g: query head
// within the kv head's group) and walks the key chunks [c0, c0 + kAttentionKeyChunk):
//   1. stage K and V of the chunk through the block table, as f32 (dequantized: kv_codes.cuh);
//   2. s[r][j] = q_r . k_j (q pre-scaled), -inf outside the row's causal/window range;
//   3. per row: m' = max(m, max_j s), p = exp(s - m'), l = l * exp(m - m') + sum p;
//   4. o[r][:] = o[r][:] * exp(m - m') + sum_j p[r][j] v_j.
// Output o / l (0 where a row saw no key; f32, or bf16 for the bf16-activation mode), or, for
// split items, o / l with (m, l) to the f32 partial buffers for MergeSplitsKernel. The counts of
// items and merges come from device memory: block x runs items x, x + gridDim.x, ... (a step's
// own launch has one block per item; a captured graph a fixed grid for every plan).

#include "common/engine/backend/cuda/attention_output.cuh"
#include "common/engine/backend/cuda/decode_attention.cuh"
#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/kv_codes.cuh"
#include "common/engine/backend/cuda/mma_attention.cuh"

namespace tandem::cuda {
namespace {

constexpr int kChunk = kAttentionKeyChunk;
constexpr float kNegInf = -__builtin_huge_valf();

struct SharedLayout {
  int64_t q, k, v, s, o, m, l, corr, ctx, begin, total;  // offsets in 4-byte words
};

TANDEM_HOST_DEVICE SharedLayout Layout(int rows, int head_dim, int max_tokens) {
  SharedLayout L;
  L.q = 0;
  L.k = L.q + static_cast<int64_t>(rows) * head_dim;
  L.v = L.k + static_cast<int64_t>(kChunk) * (head_dim + 1);
  L.s = L.v + static_cast<int64_t>(kChunk) * head_dim;
  L.o = L.s + static_cast<int64_t>(rows) * kChunk;
  L.m = L.o + static_cast<int64_t>(rows) * head_dim;
  L.l = L.m + rows;
  L.corr = L.l + rows;
  L.ctx = L.corr + rows;
  L.begin = L.ctx + max_tokens;
  L.total = L.begin + max_tokens;
  return L;
}

// One item's tile (see the file comment); a block runs items blockIdx.x, + gridDim.x, ...
template <DType KD, class OT>
TANDEM_DEVICE void AttentionItemTile(const AttentionArgs& a, const AttentionItem it, int kvh,
                                     int32_t table_stride, float* sm) {
  const int hd = a.kv.head_dim, num_kv_heads = a.kv.num_kv_heads, bs = a.kv.block_size;
  const int group = a.num_heads / num_kv_heads;
  const int ntok = it.num_tokens, rows = ntok * group;
  const int ldk = hd + 1;
  const SharedLayout L = Layout(rows, hd, ntok);
  float* qs = sm + L.q;
  float* ks = sm + L.k;
  float* vs = sm + L.v;
  float* ss = sm + L.s;
  float* os = sm + L.o;
  float* ms = sm + L.m;
  float* ls = sm + L.l;
  float* cs = sm + L.corr;
  int* tctx = reinterpret_cast<int*>(sm + L.ctx);
  int* tbegin = reinterpret_cast<int*>(sm + L.begin);
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const float scale = 1.0f / dev::Sqrt(static_cast<float>(hd));

  for (int i = tid; i < rows * hd; i += nthreads) {
    const int r = i / hd, d = i % hd;
    const int64_t t = it.token_begin + r / group;
    const int h = kvh * group + r % group;
    qs[i] = a.q[t * a.ldq + static_cast<int64_t>(h) * hd + d] * scale;
    os[i] = 0.0f;
  }
  for (int r = tid; r < rows; r += nthreads) {
    ms[r] = kNegInf;
    ls[r] = 0.0f;
  }
  for (int i = tid; i < ntok; i += nthreads) {
    const int ctx = a.context_lens[it.token_begin + i];
    tctx[i] = ctx;
    tbegin[i] = (a.sliding_window > 0 && ctx > a.sliding_window) ? ctx - a.sliding_window : 0;
  }
  dev::SyncThreads();

  // Key range of the whole tile: the union of its rows' ranges, within [kv_begin, kv_end).
  int lo = it.kv_end, hi = it.kv_begin;
  for (int i = 0; i < ntok; ++i) {
    if (tctx[i] <= tbegin[i]) continue;
    lo = tbegin[i] < lo ? tbegin[i] : lo;
    hi = tctx[i] > hi ? tctx[i] : hi;
  }
  lo = lo > it.kv_begin ? lo : it.kv_begin;
  hi = hi < it.kv_end ? hi : it.kv_end;

  const int32_t* table = a.block_tables + static_cast<int64_t>(it.table_row) * table_stride;
  const int64_t block_bytes = dev::KvBlockBytes(a.kv);
  const int64_t k_row = dev::KvRow(a.kv, 0, kvh, 0), v_row = dev::KvRow(a.kv, 1, kvh, 0);

  for (int c0 = lo; c0 < hi; c0 += kChunk) {
    const int n = hi - c0 < kChunk ? hi - c0 : kChunk;
    for (int i = tid; i < kChunk * hd; i += nthreads) {
      const int j = i / hd, d = i % hd;
      float kval = 0.0f, vval = 0.0f;
      if (j < n) {
        const int pos = c0 + j;
        const uint8_t* block = dev::KvBlockAt(a.kv, table[pos / bs], block_bytes);
        kval = dev::LoadKv<KD>(block, a.kv, k_row + pos % bs, d);
        vval = dev::LoadKv<KD>(block, a.kv, v_row + pos % bs, d);
      }
      ks[j * ldk + d] = kval;
      vs[j * hd + d] = vval;
    }
    dev::SyncThreads();
    for (int i = tid; i < rows * kChunk; i += nthreads) {
      const int r = i / kChunk, j = i % kChunk;
      const int tl = r / group, pos = c0 + j;
      float s = kNegInf;
      if (j < n && pos >= tbegin[tl] && pos < tctx[tl]) {
        const float* qr = qs + r * hd;
        const float* kr = ks + j * ldk;
        float acc = 0.0f;
        for (int d = 0; d < hd; ++d) acc += qr[d] * kr[d];
        s = acc;
      }
      ss[i] = s;
    }
    dev::SyncThreads();
    for (int r = tid; r < rows; r += nthreads) {
      float* sr = ss + r * kChunk;
      const float m_old = ms[r];
      float mx = m_old;
      for (int j = 0; j < kChunk; ++j) mx = sr[j] > mx ? sr[j] : mx;
      float corr = 1.0f;
      if (mx == kNegInf) {  // nothing visible yet in this row
        for (int j = 0; j < kChunk; ++j) sr[j] = 0.0f;
      } else {
        corr = dev::Exp(m_old - mx);  // exp(-inf) = 0 for the first visible chunk
        float sum = 0.0f;
        for (int j = 0; j < kChunk; ++j) {
          const float p = dev::Exp(sr[j] - mx);
          sr[j] = p;
          sum += p;
        }
        ls[r] = ls[r] * corr + sum;
        ms[r] = mx;
      }
      cs[r] = corr;
    }
    dev::SyncThreads();
    for (int i = tid; i < rows * hd; i += nthreads) {
      const int r = i / hd, d = i % hd;
      const float* pr = ss + r * kChunk;
      float acc = os[i] * cs[r];
      for (int j = 0; j < n; ++j) acc += pr[j] * vs[j * hd + d];
      os[i] = acc;
    }
    dev::SyncThreads();
  }

  for (int i = tid; i < rows * hd; i += nthreads) {
    const int r = i / hd, d = i % hd;
    const int tl = r / group;
    const int h = kvh * group + r % group;
    const float l = ls[r];
    StoreAttentionValue<OT>(a, it, tl, h, d, l > 0.0f ? os[i] / l : 0.0f, ms[r], l);
  }
}

// out[token][h][:] = sum_s w_s o_s / sum_s w_s with w_s = l_s exp(m_s - max_s m_s).
template <class OT>
TANDEM_DEVICE void MergeOne(const AttentionArgs& a, const CombineItem c, int h) {
  const int hd = a.kv.head_dim;
  const int64_t first = static_cast<int64_t>(c.slot) * kMaxAttentionSplits * a.num_heads + h;
  float mx = kNegInf;
  for (int s = 0; s < c.num_splits; ++s) {
    const float* ml = a.partial_ml + (first + static_cast<int64_t>(s) * a.num_heads) * 2;
    if (ml[1] > 0.0f && ml[0] > mx) mx = ml[0];
  }
  OT* out = static_cast<OT*>(a.out) + static_cast<int64_t>(c.token) * a.ldo +
            static_cast<int64_t>(h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    if (mx != kNegInf) {
      for (int s = 0; s < c.num_splits; ++s) {
        const int64_t cell = first + static_cast<int64_t>(s) * a.num_heads;
        const float l = a.partial_ml[cell * 2 + 1];
        if (!(l > 0.0f)) continue;
        const float w = l * dev::Exp(a.partial_ml[cell * 2] - mx);
        num += w * a.partial_out[cell * hd + d];
        den += w;
      }
    }
    dev::Store(out + d, den > 0.0f ? num / den : 0.0f);
  }
}

template <class OT>
TANDEM_GLOBAL void MergeSplitsKernel(AttentionArgs a) {
  const int32_t n = a.counts->num_combines;
  for (int32_t i = blockIdx.x; i < n; i += gridDim.x) MergeOne<OT>(a, a.combines[i], blockIdx.y);
}

// `smem_words`: the dynamic shared memory launched, in 4-byte words.
template <DType KD, class OT>
TANDEM_GLOBAL void AttentionKernel(AttentionArgs a, int64_t smem_words) {
  TANDEM_DYNAMIC_SHARED(float, sm);
  const AttentionCounts counts = *a.counts;
  for (int32_t i = blockIdx.x; i < counts.num_items; i += gridDim.x) {
    const AttentionItem it = a.items[i];
    if (!decode::TryDecodeItem<KD, OT>(a, it, blockIdx.y, counts.table_stride, sm, smem_words) &&
        !mma::TryMmaTile<KD, OT>(a, it, blockIdx.y, counts.table_stride, sm, smem_words)) {
      AttentionItemTile<KD, OT>(a, it, blockIdx.y, counts.table_stride, sm);
    }
    dev::SyncThreads();  // the next item reuses the shared memory
  }
}

}  // namespace

bool AttentionDecodeVectorizable(const KvLayerView& kv) { return decode::Vectorizable(kv); }

bool AttentionMmaSupported(const KvLayerView& kv) { return mma::Supported(kv); }

size_t AttentionSharedBytes(int rows, int head_dim) {
  // Tiles never hold more tokens than rows.
  return static_cast<size_t>(Layout(rows, head_dim, rows).total) * 4;
}

namespace {

template <DType KD>
cudaError_t ConfigureAttentionFor(int bytes) {
  const auto attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  cudaError_t err = cudaFuncSetAttribute(AttentionKernel<KD, float>, attr, bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(AttentionKernel<KD, uint16_t>, attr, bytes);
  return err;
}

}  // namespace

cudaError_t ConfigureAttention(size_t bytes) {
  const int value = static_cast<int>(bytes);
  cudaError_t err = ConfigureAttentionFor<DType::kF32>(value);
  if (err == cudaSuccess) err = ConfigureAttentionFor<DType::kBF16>(value);
  if (err == cudaSuccess) err = ConfigureAttentionFor<DType::kI8>(value);
  if (err == cudaSuccess) err = ConfigureAttentionFor<DType::kF8E4M3>(value);
  return err;
}

namespace {

template <DType KD, class OT>
cudaError_t LaunchAttention(const AttentionArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.grid_items),
                  static_cast<unsigned>(args.kv.num_kv_heads));
  const size_t smem = AttentionSharedBytes(args.max_tile_rows, args.kv.head_dim);
  TANDEM_LAUNCH((AttentionKernel<KD, OT>), grid, kAttentionThreads, smem, stream, args,
                static_cast<int64_t>(smem / 4));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || args.grid_combines == 0) return err;
  const dim3 merge_grid(static_cast<unsigned>(args.grid_combines),
                        static_cast<unsigned>(args.num_heads));
  TANDEM_LAUNCH(MergeSplitsKernel<OT>, merge_grid, 64, 0, stream, args);
  return cudaGetLastError();
}

template <DType KD>
cudaError_t LaunchAttentionFor(const AttentionArgs& args, cudaStream_t stream) {
  return args.out_bf16 ? LaunchAttention<KD, uint16_t>(args, stream)
                       : LaunchAttention<KD, float>(args, stream);
}

}  // namespace

cudaError_t PagedAttention(const AttentionArgs& args, cudaStream_t stream) {
  if (args.grid_items == 0) return cudaSuccess;
  switch (args.kv.dtype) {
    case DType::kF32:
      return LaunchAttentionFor<DType::kF32>(args, stream);
    case DType::kBF16:
      return LaunchAttentionFor<DType::kBF16>(args, stream);
    case DType::kI8:
      return LaunchAttentionFor<DType::kI8>(args, stream);
    case DType::kF8E4M3:
      return LaunchAttentionFor<DType::kF8E4M3>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda
