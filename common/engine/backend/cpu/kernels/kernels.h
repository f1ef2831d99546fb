#pragma once

// CPU compute kernels. Each entry point dispatches at run time to the kernels of one tier
// (common/base/cpu_features.h SimdLevel: the best this CPU supports, capped by TANDEM_SIMD;
// README "Tiers").
//
// BATCH INVARIANCE (the contract every kernel here keeps): the value computed for one token
// (one row of activations) depends only on that row's inputs and the weights, never on how many
// other rows share the call, where the row sits in the batch, the thread count or the partition
// of work among threads. Concretely: every reduction (dot products, sums of squares, softmax
// sums) runs in one fixed order per output element; no split-K; tile shapes only change which
// outputs are computed together, not the order of any reduction.

#include <cstdint>
#include <string>

#include "common/base/dtype.h"
#include "common/base/quant.h"
#include "common/base/thread_pool.h"

namespace tandem::cpu {

// Longest rows (K) that int8 MatMul inputs take: their int32 sums are exact up to it.
inline constexpr int64_t kMatMulI8MaxK = 65536;

// A weight matrix [N, K] for MatMul: dense (quant kNone, dtype kF32 or kBF16, row-major; bf16
// also in tiles) or weight-only quantized (common/base/quant.h: int8 and fp8 e4m3 per-row scales,
// int4 groups with zeros).
struct MatMulWeight {
  const void* data = nullptr;
  DType dtype = DType::kF32;  // dense element type (ignored when quantized)
  WeightQuant quant = WeightQuant::kNone;
  const float* scales = nullptr;  // int8, fp8: [N]; int4: [N, groups]
  const float* zeros = nullptr;   // int4: [N, groups], exact integers in [0, 16]
  int64_t group_size = 0;         // int4: a power of two >= 32
  // Quantized: kTiles16 with int8 inputs (and only then), kRows with f32 or bf16 inputs (fp8:
  // always kRows; it takes no int8 inputs). Dense:
  // kRows, or kTiles16 for bf16 weights with bf16 inputs (vdpbf16ps on AVX512_BF16 reads the
  // tiles; other CPUs turn them back into rows a block at a time).
  WeightLayout layout = WeightLayout::kRows;
  // What x is rounded to before the products: kF32 (not at all), kBF16 (bf16 or quantized
  // weights: each x element rounded to nearest-even bf16, exact bf16 x bf16 products, f32 sums;
  // on AVX512_BF16 by vdpbf16ps, twice the products per instruction) or kI8 (int8 / int4
  // weights: each x row quantized to int8 with one f32 scale, integer dot products;
  // on AVX512_VNNI by vpdpbusd; int8_inputs.h). Like the weight format, it is fixed per weight,
  // so batch invariance holds within each choice.
  DType input_dtype = DType::kF32;  // kI8: K <= kMatMulI8MaxK
  // Bytes of one stored row of K elements (excluding scales).
  int64_t RowBytes(int64_t K) const;
};

// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n] if bias != nullptr), m < M, n < N.
// x: f32 [M, K] row stride ldx; W: row-major [N, K] of `wtype` (kF32 or kBF16), row stride K;
// y: f32 [M, N] row stride ldy. The weights are streamed once per call for all M rows.
void MatMul(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType wtype,
            int64_t N, const float* bias, float* y, int64_t ldy, ThreadPool* pool);
// The same for any weight format. Quantized weights are dequantized in registers (one exact f32
// product per element, see quant.h) and then used exactly like dense f32 weights, so the result
// equals MatMul over the dequantized f32 matrix bit for bit (same SIMD level).
void MatMul(const float* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w, int64_t N,
            const float* bias, float* y, int64_t ldy, ThreadPool* pool);

// One of several projections of the same input (MatMulShared): y[M, N] (row stride ldy).
struct MatMulProjection {
  MatMulWeight w;
  int64_t N = 0;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
};
// The projections of one input x (q/k/v, gate/up) in one call: the input is rounded or quantized
// once when the weights take it in the same form, and their columns are split over the pool
// together (one fork/join). Each y equals its own MatMul bit for bit.
void MatMulShared(const float* x, int64_t M, int64_t K, int64_t ldx,
                  const MatMulProjection* projections, int count, ThreadPool* pool);

// The kernel a MatMul over `w` runs on the active tier:
//   kF32          f32 inputs over dense f32 or bf16 weights (bf16 widened in registers), FMA
//   kF32Dequant   f32 inputs over int8 / int4 weights dequantized to f32 in registers, FMA
//   kBf16Dot      bf16 inputs on the tier's bf16 dot products (vdpbf16ps)
//   kBf16ViaF32   bf16 inputs rounded, widened back and FMA'd (quantized weights or bf16 tiles
//                 first dequantized to bf16 rows by scalar code): a tier without bf16 dots
//   kI8Dot        int8 inputs on the tier's integer dot products
//   kI8Reference  int8 inputs on the scalar reference (MatMulI8Reference)
enum class MatMulPath { kF32, kF32Dequant, kBf16Dot, kBf16ViaF32, kI8Dot, kI8Reference };
MatMulPath MatMulPathOf(const MatMulWeight& w);
const char* MatMulPathName(MatMulPath p);
// Whether `p` on the active tier is a kernel tuned for it (kF32, kBf16Dot, kI8Dot on a SIMD
// tier) rather than a generic fallback (dequantizing to f32 or bf16, the scalar reference, or
// any path of the scalar tier).
bool MatMulPathTuned(MatMulPath p);

// What `--matmul-input-dtype auto` resolves to on the active tier, for the MatMuls of weights of
// format `quant` (kNone: dense weights of `dtype`): the input dtype whose kernels are fastest
// there (README, "Tiers"); f32 for fp8 weights (its SIMD dequantizing FMA kernels). Quantized
// weights taking kI8 are loaded in WeightLayout::kTiles16.
DType AutoMatMulInputDtype(WeightQuant quant, DType dtype);
// Whether dense bf16 weights are best loaded in WeightLayout::kTiles16 on the active tier (its
// bf16 dot products read the tiles) when their inputs are not f32.
bool Bf16TilesPreferred();
// The active tier's name (SimdLevelName), for logs and metric labels.
std::string ActiveTierName();

// The row-wise ops below (RmsNorm, AddRmsNorm, ApplyRope, SiluMul, WriteKv) split their rows
// over `pool` when a call has enough elements to pay for a fork/join (prefill chunks, decode
// batches of ~16 and up); every row is computed the same way wherever it runs.

// out[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * weight[:]. x, out: f32 [M, D]; may alias.
void RmsNorm(const float* x, const float* weight, int64_t M, int64_t D, float eps, float* out,
             ThreadPool* pool = nullptr);

// residual[m, :] += delta[m, :]; then out[m, :] = RmsNorm(residual[m, :]).
void AddRmsNorm(float* residual, const float* delta, const float* weight, int64_t M, int64_t D,
                float eps, float* out, ThreadPool* pool = nullptr);

// Rotary embedding in Hugging Face's rotate_half layout, in place, for each token m:
// for each head h and i < head_dim/2, with (c, s) = cos_sin[pos[m]][i]:
//   a = x[h, i], b = x[h, i + head_dim/2];  x[h, i] = a*c - b*s;  x[h, i + head_dim/2] = b*c + a*s
// x: f32 [M, num_heads * head_dim] row stride ldx. cos_sin: f32 [max_pos][head_dim/2][2].
void ApplyRope(float* x, int64_t M, int64_t ldx, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* cos_sin, ThreadPool* pool = nullptr);

// out[m, i] = silu(gate[m, i]) * up[m, i], silu(g) = g / (1 + exp(-g)). f32 [M, F] contiguous.
void SiluMul(const float* gate, const float* up, int64_t M, int64_t F, float* out,
             ThreadPool* pool = nullptr);

// out[m, :] = table[ids[m], :] converted to f32. table: [vocab, D] of kF32 or kBF16.
void Embed(const int32_t* ids, int64_t M, const void* table, DType dtype, int64_t D, float* out);

// Paged KV cache of one layer. Block b holds `block_size` token slots and is one contiguous
// region laid out [2 (K, V)][num_kv_heads][block_size][head_dim] of `dtype` (kF32, kBF16, kI8 or
// kF8E4M3), the 1-byte dtypes followed by one f32 scale per row [2][num_kv_heads][block_size]
// (common/base/kv_layout.h), so a (layer, block) pair is a single span for transfer.
// Slot s = block * block_size + offset.
struct PagedKvLayer {
  void* base = nullptr;  // start of block 0 of this layer
  DType dtype = DType::kF32;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // Block stride in elements of `dtype` (bytes for the 1-byte dtypes, scales included).
  int64_t block_stride_elems() const {
    const int64_t rows = 2 * num_kv_heads * block_size;
    return rows * head_dim + (DTypeSize(dtype) == 1 ? rows * 4 : 0);
  }
};

// Writes each token's K and V into its slot (quantized dtypes: each (token, head) row gets its own
// scale from its max |value|: int8 codes rint(x / s), s = max / 127; fp8 e4m3 codes of x / s
// rounded to nearest even, s = max / 448). k, v: f32 [M, num_kv_heads * head_dim] with row
// strides ldk, ldv. slots[m] < 0 means "no slot" (skip).
void WriteKv(const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t M,
             const int64_t* slots, const PagedKvLayer& kv, ThreadPool* pool = nullptr);

// One query token's attention work item.
struct AttentionQuery {
  int64_t row = 0;                       // row of q / out
  int64_t context_len = 0;               // attends to positions [0, context_len) of its sequence
  const int32_t* block_table = nullptr;  // block ids covering those positions, in order
};

// Causal attention over the paged cache, GQA (num_heads a multiple of num_kv_heads), scale
// 1/sqrt(head_dim). q: f32 [*, num_heads*head_dim] row stride ldq; out likewise (ldo). For each
// query and head: scores over positions in ascending order, softmax with max subtraction, then the
// weighted sum of V in ascending position order. Parallel over (query, head) pairs; each pair's
// arithmetic is the same whichever pool or batch it runs in. sliding_window > 0 restricts
// attention to the last `sliding_window` positions. softcap > 0 caps every scaled score s to
// softcap * tanh(s / softcap) before the softmax (Gemma 2's attn_logit_softcapping).
void PagedAttention(const float* q, int64_t ldq, const AttentionQuery* queries, int64_t num_queries,
                    int64_t num_heads, const PagedKvLayer& kv, int64_t sliding_window, float* out,
                    int64_t ldo, ThreadPool* pool, float softcap = 0.0f);

// Reads back one token slot's K or V (f32) for tests and transfer checks. which: 0 = K, 1 = V.
void ReadKvSlot(const PagedKvLayer& kv, int64_t slot, int which, float* out);

}  // namespace tandem::cpu
