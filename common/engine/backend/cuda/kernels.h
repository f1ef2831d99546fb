#pragma once

// Host entry points of the CUDA kernels. Each enqueues its work on `stream` and returns the launch
// status (cudaGetLastError after the launch; cudaSuccess without launching when there is nothing
// to do). Pointers are device pointers. Arithmetic is fp32 throughout; bf16 appears only as
// storage (weights, KV cache, and the matmul inputs of the bf16-activation mode), converted with
// round-to-nearest-even like the CPU kernels, and int8 / fp8 only as KV cache storage.
// The semantics of each op are those of the CPU kernel of the same name
// (common/engine/backend/cpu/kernels/kernels.h) unless stated otherwise.

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"
#include "common/cuda/cuda_api.h"

namespace tandem::cuda {

// Outputs written as `void* out, bool out_bf16` hold f32 values, or with out_bf16 the same values
// rounded to nearest-even bf16 (the rounding the CPU's bf16-input matmuls apply to their inputs):
// the matmul inputs of the bf16-activation mode come out of these kernels already converted.

// out[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * weight. x: f32 [M, D], out [M, D].
cudaError_t RmsNorm(const float* x, const float* weight, int64_t M, int64_t D, float eps, void* out,
                    bool out_bf16, cudaStream_t stream);

// residual += delta; out = RmsNorm(residual).
cudaError_t AddRmsNorm(float* residual, const float* delta, const float* weight, int64_t M,
                       int64_t D, float eps, void* out, bool out_bf16, cudaStream_t stream);

// x[m, :] = table[ids[m], :] as f32 (Embed), out = RmsNorm(x): the first layer's input.
cudaError_t EmbedRmsNorm(const int32_t* ids, int64_t M, const void* table, bool table_bf16,
                         int64_t D, const float* weight, float eps, float* x, void* out,
                         bool out_bf16, cudaStream_t stream);

// out[i, :] = RmsNorm(x[rows[i], :] + delta[rows[i], :]) for i < n (x, delta: row stride ld; out
// [n, D] contiguous); x is not updated, so rows may repeat. The final norm of the logit rows.
cudaError_t GatherAddRmsNorm(const float* x, const float* delta, int64_t ld, const int32_t* rows,
                             int64_t n, int64_t D, const float* weight, float eps, void* out,
                             bool out_bf16, cudaStream_t stream);

// out[m, i] = silu(gate_up[m, i]) * gate_up[m, F + i]; gate_up rows have stride ld (>= 2F),
// out is [M, F] contiguous.
cudaError_t SiluMul(const float* gate_up, int64_t ld, int64_t M, int64_t F, void* out,
                    bool out_bf16, cudaStream_t stream);

// One layer of the paged KV pool, laid out like the CPU's (cpu::PagedKvLayer and
// common/base/kv_layout.h): block b is [2 (K, V)][num_kv_heads][block_size][head_dim] codes of
// `dtype` (f32, bf16, or the quantized int8 and fp8 e4m3), the quantized ones followed by one f32
// scale per row [2][num_kv_heads][block_size]; kv_codes.cuh reads and writes them.
//
// Zero-copy KV transfer on one GPU (kvtransfer/README.md, "Zero-copy on one GPU"): a block id
// from kKvRemoteBlock on names block (id - kKvRemoteBlock) of a second pool of the same region
// layout at `remote_base` (a decode worker's pool mapped into this process; the layer's base
// there, its blocks one region apart), so one block table (and a slot, block * block_size +
// offset) mixes local and remote blocks. The kernels branch on the tag where they form a block's
// address (dev::KvBlockAt); a tagged id with a null remote_base is a caller's error.
inline constexpr int32_t kKvRemoteBlock = 1 << 30;
struct KvLayerView {
  void* base = nullptr;
  DType dtype = DType::kF32;
  int32_t block_size = 16;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  void* remote_base = nullptr;
};

// The attention inputs of M tokens from their fused q/k/v projections `qkv` (f32 [M, ld]: q of
// num_heads heads, then k and v of kv.num_kv_heads heads), in one kernel: `bias` (f32 [q + 2 kv]
// or null) is added to all three; q and k are rotated (rotate_half, the CPU's ApplyRope) at
// `positions` with cos_sin (f32 [max_pos][head_dim / 2][2], model/rope.h), q in place; k and v
// are written to each token's KV slot (the CPU's WriteKv, the same bytes for the same k and v,
// quantized rows included; slots[m] < 0: not written).
cudaError_t RopeWriteKv(float* qkv, int64_t ld, int64_t M, int64_t num_heads,
                        const int32_t* positions, const float* cos_sin, const float* bias,
                        const int64_t* slots, const KvLayerView& kv, cudaStream_t stream);

// Splits f32 activations into bf16 for tensor-core products: out[m, :] = bf16(x[m, :]) and, with
// `with_low`, out[M + m, :] = bf16(x[m, :] - out[m, :]), so that hi + lo carries ~16 mantissa
// bits. x rows have stride ldx; out is [M or 2M, K] contiguous.
cudaError_t SplitToBf16(const float* x, int64_t M, int64_t K, int64_t ldx, bool with_low,
                        uint16_t* out, cudaStream_t stream);

// y[m, n] = y2[m, n] + y2[M + m, n]; y2 is [2M, N] contiguous, y has row stride ldy.
cudaError_t CombineSplit(const float* y2, int64_t M, int64_t N, float* y, int64_t ldy,
                         cudaStream_t stream);

// ---- GEMV / skinny GEMM (gemv_kernels.cu) ----

// Rows of activations a Gemv call takes at most.
inline constexpr int kGemvMaxRows = 8;

// y[m, j] = sum_k x[m, k] * w[j, k] (+ bias[j]) for m < rows, j < n, with bf16 weights, f32
// accumulation, each weight row read once for all rows. With silu_mul, w holds 2n rows (gate
// rows then up rows) and y[m, j] = silu(gate_j . x_m) * (up_j . x_m) (no bias).
struct GemvArgs {
  const void* x = nullptr;  // [rows, k], row stride ldx: bf16 (x_bf16) or f32
  int64_t ldx = 0;
  bool x_bf16 = false;
  int32_t rows = 0;             // 1 .. kGemvMaxRows
  const uint16_t* w = nullptr;  // bf16 [n or 2n, k], row stride k
  int64_t n = 0;
  int64_t k = 0;
  const float* bias = nullptr;  // [n] or null
  void* y = nullptr;            // [rows, n], row stride ldy: bf16 (y_bf16) or f32
  int64_t ldy = 0;
  bool y_bf16 = false;
  bool silu_mul = false;
};
// cudaErrorInvalidValue for more than kGemvMaxRows rows or a bias with silu_mul.
cudaError_t Gemv(const GemvArgs& args, cudaStream_t stream);
// Whether the call takes the 128-bit path (k % 8 == 0 and 16-byte aligned x, w and x rows).
bool GemvVectorized(const GemvArgs& args);

// ---- Paged attention ----

// Splits of one query tile over the key range, at most (partial buffers are sized for this).
inline constexpr int kMaxAttentionSplits = 16;
// Keys per shared-memory chunk in the attention kernel.
inline constexpr int kAttentionKeyChunk = 32;
// Threads per attention block.
inline constexpr int kAttentionThreads = 128;
// Query rows (tokens x query heads per kv head) of a decode item, at most.
inline constexpr int kAttentionDecodeRows = 8;
// AttentionItem::path: the fp32 SIMT tile path (attention_kernels.cu); the decode path
// (decode_attention.cuh: at most kAttentionDecodeRows rows, K/V rows read as vectors by warps);
// tiles on tensor cores (mma_attention.cuh: bf16 mma, f32 accumulation).
inline constexpr int32_t kAttentionPathTile = 0;
inline constexpr int32_t kAttentionPathDecode = 1;
inline constexpr int32_t kAttentionPathMma = 2;

// One thread block's work (times num_kv_heads in gridDim.y): a tile of consecutive query tokens
// of one sequence and one kv head's group of query heads, over key positions [kv_begin, kv_end)
// intersected with each token's causal/window range.
struct AttentionItem {
  int32_t token_begin = 0;  // first token (row of q / out) of the tile
  int32_t num_tokens = 0;   // tokens in the tile
  int32_t table_row = 0;    // row of block_tables holding the sequence's blocks
  int32_t kv_begin = 0;
  int32_t kv_end = 0;
  int32_t partial = -1;  // -1: write `out`; else the first token's partial slot (tokens follow)
  int32_t split = 0;     // index of this key range among the tile's splits
  // Which code runs the item (kAttentionPath*) where the pool's layout allows it; else the SIMT
  // tile path.
  int32_t path = 0;
};

// Merges the splits of one token: out[token] from partial slot `slot`, splits [0, num_splits).
struct CombineItem {
  int32_t token = 0;
  int32_t slot = 0;
  int32_t num_splits = 0;
  int32_t reserved = 0;
};

// What varies from step to step and is read by the attention kernels from device memory (so a
// captured graph serves every step of its shape): items and merges to run, block-table stride.
struct AttentionCounts {
  int32_t num_items = 0;
  int32_t num_combines = 0;
  int32_t table_stride = 0;
  int32_t reserved = 0;
};

struct AttentionArgs {
  const float* q = nullptr;  // [T, num_heads * head_dim], row stride ldq
  int64_t ldq = 0;
  void* out = nullptr;  // [T, num_heads * head_dim], row stride ldo: f32, or bf16 with out_bf16
  int64_t ldo = 0;
  bool out_bf16 = false;
  int32_t num_heads = 0;
  KvLayerView kv;
  const int32_t* block_tables = nullptr;    // [rows, counts->table_stride]
  const int32_t* context_lens = nullptr;    // [T]: token attends to positions [0, len); 0: none
  int32_t sliding_window = 0;               // > 0: only the last `sliding_window` positions
  const AttentionCounts* counts = nullptr;  // device memory
  const AttentionItem* items = nullptr;     // [counts->num_items]
  const CombineItem* combines = nullptr;    // [counts->num_combines]
  // Blocks launched along the items (block i runs items i, i + grid_items, ...; 0: nothing is
  // launched) and along the merges (0: no merge kernel). A step's own counts, or fixed sizes
  // for a captured graph.
  int32_t grid_items = 0;
  int32_t grid_combines = 0;
  int32_t max_tile_rows = 0;     // max over items of num_tokens * (num_heads / num_kv_heads)
  float* partial_out = nullptr;  // [slots][kMaxAttentionSplits][num_heads][head_dim]
  float* partial_ml = nullptr;   // [slots][kMaxAttentionSplits][num_heads][2] (max, sum)
  // Decode items: block-table entries staged in shared memory at a time, at most (0: as many as
  // the shared memory holds).
  int32_t decode_table_span = 0;
};

// Causal attention over the paged cache with online softmax (flash-style tiling over key chunks),
// scale 1/sqrt(head_dim), then the merge of split items. Every output row belonging to some item
// is written.
cudaError_t PagedAttention(const AttentionArgs& args, cudaStream_t stream);

// Whether items marked kAttentionPathDecode over `kv` run on the decode path: head_dim a
// multiple of 8 up to 256 and the pool's rows aligned to its vector loads. Else they run as tiles.
bool AttentionDecodeVectorizable(const KvLayerView& kv);
// Whether tiles marked kAttentionPathMma over `kv` run on tensor cores: head_dim a multiple of 16
// up to 128 and the decode path's vector layout (else they run on the SIMT tile path). Their
// results agree with f32 attention to about bf16 precision (q, K, V and the softmax weights are
// rounded to bf16; products exact, sums f32).
bool AttentionMmaSupported(const KvLayerView& kv);

// Dynamic shared memory of an attention block for tiles of `rows` query rows.
size_t AttentionSharedBytes(int rows, int head_dim);

// Allows the attention kernels up to `bytes` of dynamic shared memory on the current device
// (needed above 48 KiB). Call once per device before PagedAttention.
cudaError_t ConfigureAttention(size_t bytes);

// --- Sampling on the device (sampling_kernels.cu; the host sampler's contract,
// common/engine/sampler/README.md) ---

// One logit edit as the host builds it (LogitEdit in common/engine/sampler/logit_edits.h, same
// layout): op 0 add, 1 -inf, 2 repetition penalty, 3 subtract.
struct SampleEdit {
  int32_t id;
  int32_t op;
  float value;
};

// One sampled row. Offsets index the arrays of SampleArgs.
struct SampleRowArgs {
  int32_t logit_row = 0;  // row of SampleArgs::logits
  int32_t top_k = 0;
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t logprobs = -1;     // -1: none, else the top n (<= kMaxSampleLogprobs) too
  double uniform = 0.0;      // the draw's uniform in [0, 1)
  int32_t edits_begin = 0;   // the row's edits in `edits`
  int32_t phases_begin = 0;  // its phase ends (relative to edits_begin) in `phase_ends`
  int32_t num_phases = 0;
  int32_t mask_begin = -1;   // its allowed-token words in `masks` ((vocab + 63) / 64), -1: none
  int32_t revive_begin = 0;  // ids set to 0 when not finite after the mask, in `revive`
  int32_t num_revive = 0;
};

inline constexpr int kMaxSampleLogprobs = 20;

struct SampleOutput {
  int32_t token;
  float logprob;  // of the chosen token in the raw row (logprobs >= 0)
  int32_t top_ids[kMaxSampleLogprobs];
  float top_logprobs[kMaxSampleLogprobs];
};

struct SampleArgs {
  const float* logits = nullptr;  // [*, vocab] raw rows (not changed)
  int32_t vocab = 0;
  float* work = nullptr;  // [num_rows, vocab] scratch: the processed rows
  const SampleRowArgs* rows = nullptr;
  int32_t num_rows = 0;
  const SampleEdit* edits = nullptr;
  const int32_t* phase_ends = nullptr;
  const uint64_t* masks = nullptr;
  const int32_t* revive = nullptr;
  SampleOutput* out = nullptr;  // [num_rows]
};

// One block per row: the raw row's logprobs (log-softmax, top n), the edits phase by phase, the
// mask, then greedy (argmax, lowest id on ties) or temperature, top-k, top-p, min-p and an
// inverse-CDF draw with the row's uniform, in the host sampler's order (id order without a cut,
// descending logit and ascending id with one). Reductions run in a fixed order, so a row's
// answer is a function of its inputs.
cudaError_t SampleRows(const SampleArgs& args, cudaStream_t stream);

// tokens[pairs[2i]] = samples[pairs[2i + 1]].token for i < n: the tokens a launched step sampled
// on the device become the next step's input ids without a trip through the host (overlapped
// steps, common/engine/README.md).
cudaError_t GatherSampledTokens(const SampleOutput* samples, const int32_t* pairs, int64_t n,
                                int32_t* tokens, cudaStream_t stream);

}  // namespace tandem::cuda
