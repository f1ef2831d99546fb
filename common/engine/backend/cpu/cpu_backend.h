#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/engine/backend/backend.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cpu/lora.h"
#include "common/engine/backend/cpu/moe.h"
#include "common/engine/model/model.h"

namespace tandem {

struct CpuBackendOptions {
  int num_threads = 0;           // 0: one per available core
  int64_t block_size = 16;       // tokens per KV block
  int64_t num_blocks = 0;        // KV pool size in blocks (> 0)
  DType kv_dtype = DType::kF32;  // kF32, kBF16, kI8 or kF8E4M3 (common/base/kv_layout.h)
  // What the projections' inputs are rounded to (cpu::MatMulWeight::input_dtype): kF32 (exact
  // f32 activations) or kBF16 (bf16 dot products, vdpbf16ps on AVX512_BF16, over bf16 weights or
  // int8 / int4 weights dequantized to bf16 a block at a time; dense f32 weights stay f32) or
  // kI8 (int8 / int4 weights only: each input row quantized with one scale, integer dot products,
  // vpdpbusd on AVX512_VNNI; dense bf16 weights such as an unquantized lm_head take bf16).
  DType matmul_input_dtype = DType::kF32;
  // Commit every page of the KV pool at creation, on the compute threads: memory pressure then
  // fails the start instead of a request later, and no step pays the pool's first-touch faults
  // (a fresh 2 MiB page's first touch can cost milliseconds on a VM). Off: pages come on first
  // use (the pool is mapped with MAP_NORESERVE).
  bool commit_kv = true;
  // Tokens per step at most (the scheduler's max_num_batched_tokens; 0: unknown). When set, the
  // activation buffers are sized for it at creation and their pages touched then, as the KV
  // pool's: otherwise the first step of a new size faults them in (on a VM, a large share of
  // the first long prefill). Larger steps still work (the buffers grow).
  int64_t max_num_tokens = 0;
  // Window layout (KvCacheSpec::windowed) for models whose sliding-window layers alternate with
  // global ones: local layers keep only their window's pages. Callers then pass local tables in
  // every ForwardSeq (KvCacheManager does). Off: every layer keeps every block.
  bool window_kv = false;
};

// Runs Llama-family forward passes on the CPU over a paged KV cache held in host memory.
// Batch-invariant (see kernels/kernels.h): a token's logits do not depend on the batch.
// Thread model: Forward() is called by the engine thread only; compute fans out to the pool.
class CpuBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(std::shared_ptr<const Model> model,
                                                            const CpuBackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  // The kernels' tier ("simd": avx2, avx512-vnni, neon-dotprod, ...) and the MatMul input dtype,
  // as (label, value) pairs of the tandem_backend_info metric.
  std::vector<std::pair<std::string, std::string>> InfoLabels() const;
  const KvCacheSpec& kv_spec() const override { return spec_; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  absl::Status CheckLora(int64_t, int64_t, DType) const override {  // adapters stay in host memory
    return absl::OkStatus();
  }
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  void CopyBlock(int32_t src, int32_t dst) override;
  uint8_t* HostBlockRegion(int64_t layer, int32_t block) override;
  absl::Status ReadBlockRegion(int64_t layer, int32_t block, uint8_t* dst) override;
  absl::Status WriteBlockRegion(int64_t layer, int32_t block, const uint8_t* src) override;
  void MapLocalPage(int32_t block, int64_t group, int32_t page) override;

  // Bytes of KV pool per block id (all layers, or one page of the window layout), for sizing the
  // pool from a memory budget.
  static size_t KvBytesPerBlock(const ModelConfig& config, int64_t block_size, DType kv_dtype,
                                bool window_kv = false);

  // Seconds Create() spent committing the KV pool (CpuBackendOptions::commit_kv), else 0.
  double kv_commit_seconds() const { return kv_commit_seconds_; }
  // Bytes of the activation buffers sized at creation (CpuBackendOptions::max_num_tokens).
  size_t activation_bytes() const;

 private:
  CpuBackend(std::shared_ptr<const Model> model, const CpuBackendOptions& options);
  cpu::PagedKvLayer KvLayer(int64_t layer) const;

  std::shared_ptr<const Model> model_;
  CpuBackendOptions options_;
  KvCacheSpec spec_;
  std::unique_ptr<ThreadPool> pool_;
  uint8_t* kv_ = nullptr;  // [slot][block][region] (KvCacheSpec::layer_slot), page-aligned
  size_t kv_bytes_ = 0;
  // Window layout: [group - 1][block] -> page of that local group (-1: none), read by transport
  // threads (HostBlockRegion) while the engine thread maps other blocks.
  std::unique_ptr<std::atomic<int32_t>[]> local_map_;
  std::vector<uint8_t> zero_region_;  // what an unmapped local region reads as
  // Per local group: the queries' block tables and the tokens' KV slots in that group's pages.
  std::vector<std::vector<cpu::AttentionQuery>> local_queries_;
  std::vector<std::vector<int64_t>> local_slots_;
  double kv_commit_seconds_ = 0;
  // Sizes the activation buffers below for steps of t tokens.
  void GrowActivations(int64_t t);
  // The per-token activation buffers with their floats per token.
  struct ActivationBuffer {
    std::vector<float> CpuBackend::*buffer;
    int64_t per_token;
  };
  std::array<ActivationBuffer, 10> ActivationBuffers() const;
  std::vector<float> rope_;        // [max_pos][head_dim/2][2]
  std::vector<float> rope_local_;  // sliding layers' table when their base differs (Gemma 3)
  int64_t max_positions_ = 0;

  // Activation scratch, grown on demand.
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_, act_, tmp_, final_;
  std::vector<float> permuted_;  // act-order int4: a projection's input gathered by input_perm
  std::vector<cpu::AttentionQuery> queries_;
  std::unique_ptr<MoeMlp> moe_ = std::make_unique<MoeMlp>();  // experts' scratch
  std::vector<cpu::MatMulProjection> projections_;            // one MatMulShared call's projections
  LoraRunner lora_;                                           // this step's LoRA groups and scratch
};

}  // namespace tandem
