#pragma once

// Internal interface between the dispatcher (dispatch.cc, baseline flags) and the per-ISA kernel
// files (kernels_{scalar,avx2,avx512}.cc). Each ISA file fills one KernelTable with
// single-threaded range functions; the dispatcher does threading and scratch memory.

#include <cstdint>
#include <vector>

#include "common/base/cpu_features.h"
#include "common/base/dtype.h"
#include "common/base/quant.h"
#include "common/engine/backend/cpu/kernels/kernels.h"

namespace tandem::cpu::internal {

// Row n of int4 weights in WeightLayout::kRows (common/base/quant.h): its codes, its groups'
// scales and zeros; element k is in group k >> shift. The int4 row formats of matmul_impl.h and
// kernels_avx512bf16.cc read through it.
struct Int4Row {
  const uint8_t* q;
  const float* s;
  const float* z;
  int shift;
};
inline Int4Row MakeInt4Row(const MatMulWeight& w, int64_t n, int64_t K) {
  const int64_t groups = Int4Groups(K, w.group_size);
  int shift = 0;
  while ((int64_t{1} << shift) < w.group_size) ++shift;
  return Int4Row{static_cast<const uint8_t*>(w.data) + n * Int4RowBytes(K), w.scales + n * groups,
                 w.zeros + n * groups, shift};
}

struct KernelTable {
  SimdLevel level;
  const char* name;
  // y[m, n] for all m < M and n in [n_begin, n_end); otherwise as cpu::MatMul.
  void (*matmul)(const float* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
                 int64_t n_begin, int64_t n_end, const float* bias, float* y, int64_t ldy);
  void (*rms_norm)(const float* x, const float* weight, int64_t M, int64_t D, float eps,
                   float* out);
  void (*add_rms_norm)(float* residual, const float* delta, const float* weight, int64_t M,
                       int64_t D, float eps, float* out);
  void (*apply_rope)(float* x, int64_t M, int64_t ldx, int64_t num_heads, int64_t head_dim,
                     const int32_t* positions, const float* cos_sin);
  void (*silu_mul)(const float* gate, const float* up, int64_t M, int64_t F, float* out);
  void (*embed)(const int32_t* ids, int64_t M, const void* table, DType dtype, int64_t D,
                float* out);
  void (*write_kv)(const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t M,
                   const int64_t* slots, const PagedKvLayer& kv);
  void (*read_kv_slot)(const PagedKvLayer& kv, int64_t slot, int which, float* out);
  // One attention work item: the `group` query heads that share kv head `kv_head`, of `count`
  // queries with one block table at consecutive context lengths (count > 1 only where the
  // sliding window cuts none of them; attention_impl.h). scratch holds at least count * group *
  // (AttentionSpan(queries[count - 1].context_len, sliding_window) + 1) floats.
  void (*attention)(const float* q, int64_t ldq, const AttentionQuery* queries, int64_t count,
                    int64_t kv_head, int64_t group, const PagedKvLayer& kv, int64_t sliding_window,
                    float scale, float softcap, float* out, int64_t ldo, float* scratch);
  // out[i] = exp(x[i]) with the vector exp the attention and SiLU kernels use.
  void (*exp)(const float* x, int64_t n, float* out);
};

const KernelTable& ScalarKernels();
// MatMul of bf16 inputs x (row stride ldx, in elements) on AVX512_BF16 (kernels_avx512bf16.cc);
// callable only when GetCpuFeatures().avx512bf16. Columns [n0, n1). Dense bf16 weights are used
// in place; int8 / int4 weights are dequantized to bf16 `scratch_rows` rows at a time into
// `scratch` (scratch_rows * K elements; unused for dense weights).
void MatMulBf16Avx512(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
                      int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy,
                      uint16_t* scratch, int64_t scratch_rows);
// The same over dense bf16 weights in WeightLayout::kTiles16 (kernels_avx512bf16_tiles.cc).
void MatMulBf16TilesAvx512(const uint16_t* x, int64_t M, int64_t K, int64_t ldx,
                           const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias,
                           float* y, int64_t ldy);
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();

// The f32 table of the tier the public entry points use (tiers.h ActiveTier()).
const KernelTable& ActiveKernels();

// Number of key positions a query attends to.
inline int64_t AttentionSpan(int64_t context_len, int64_t sliding_window) {
  if (context_len <= 0) return 0;
  return (sliding_window > 0 && context_len > sliding_window) ? sliding_window : context_len;
}

}  // namespace tandem::cpu::internal
