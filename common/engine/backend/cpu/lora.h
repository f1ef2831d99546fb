#pragma once

#include <cstdint>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/engine/backend/backend.h"
#include "common/engine/lora/lora_adapter.h"

namespace tandem {

// The LoRA terms of one forward pass on the CPU (SGMV-style: grouped by adapter). Prepare
// groups the batch's tokens by the adapter of their sequence; Add then adds, after a base
// projection y = W x, each group's scale * B (A x) to its rows: x rows gathered, U = X A^T
// (cpu::MatMul, N = rank), U *= scale, D = U B^T (cpu::MatMul, K = rank), y += D (a group of one
// row: the expand adds into y directly, MatMul's bias being y's row). Every product is
// cpu::MatMul over f32 inputs (adapter weights f32 or bf16; x rounded to bf16 first with the
// backend's bf16 matmul inputs, set_bf16_inputs), per row and in a fixed order, so a
// token's result depends only on its own row and adapter: batch invariance holds with adapters
// mixed in any way. Tokens of the base model (no adapter) are untouched. Engine thread only
// (the products fan out to the pool).
class LoraRunner {
 public:
  // Whether the shrink's inputs x are rounded to bf16 first, as the base products round theirs
  // (the backend's bf16 matmul inputs; the CUDA backend's bf16 activations are the same values).
  // The expand's inputs (the low-rank U) stay f32.
  void set_bf16_inputs(bool on) { bf16_inputs_ = on; }
  // Groups the tokens of `batch`; false when no sequence has an adapter (Add is then a no-op).
  bool Prepare(const ForwardBatch& batch);
  bool active() const { return !groups_.empty(); }
  // y[t, 0:N] (row stride ldy) += the LoRA term of `target` in `layer` for x[t, 0:K] (row
  // stride ldx) of every token t whose adapter targets it.
  void Add(int64_t layer, LoraTarget target, const float* x, int64_t K, int64_t ldx, float* y,
           int64_t N, int64_t ldy, ThreadPool* pool);

 private:
  struct Group {
    const LoraAdapter* adapter = nullptr;
    std::vector<int32_t> rows;  // token indices, ascending
  };
  std::vector<Group> groups_;
  bool bf16_inputs_ = false;
  std::vector<float> gathered_, low_, delta_;
};

}  // namespace tandem
