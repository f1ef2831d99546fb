#pragma once

// The CUDA backend's class (internal: use cuda_backend.h). Tests include it for the counters.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "common/engine/backend/cuda/attention_plan.h"
#include "common/engine/backend/cuda/cuda_backend.h"
#include "common/engine/backend/cuda/cuda_util.h"
#include "common/engine/backend/cuda/device_weights.h"
#include "common/engine/backend/cuda/gemm.h"

namespace tandem::cuda {

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(std::shared_ptr<const Model> model,
                                                             const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  const KvCacheSpec& kv_spec() const override { return spec_; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  void CopyBlock(int32_t src, int32_t dst) override;
  uint8_t* HostBlockRegion(int64_t layer, int32_t block) override { return nullptr; }
  absl::Status ReadBlockRegion(int64_t layer, int32_t block, uint8_t* dst) override;
  absl::Status WriteBlockRegion(int64_t layer, int32_t block, const uint8_t* src) override;

  // Device address of a (layer, block) region (see CudaDeviceBlockRegion).
  uint8_t* DeviceBlockRegion(int64_t layer, int32_t block) const { return Region(layer, block); }

  // Statistics for tests and benchmarks.
  int64_t graphs_captured() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t graph_steps() const { return graph_steps_; }
  int64_t eager_steps() const { return eager_steps_; }
  size_t weight_bytes() const { return weights_->bytes(); }
  size_t kv_pool_bytes() const { return kv_.bytes(); }

 private:
  // Offsets (bytes) of the per-step inputs, identical in the pinned staging buffer and on the
  // device. The per-token arrays come first so one copy covers them.
  struct InputLayout {
    size_t tokens = 0, positions = 0, context_lens = 0, logit_rows = 0, slots = 0, head_end = 0;
    size_t tables = 0, items = 0, combines = 0, total = 0;
  };
  // What one forward enqueues; pointers are device pointers.
  struct StepShape {
    int64_t tokens = 0;
    int64_t logit_rows = 0;
    bool gather = true;  // logits of rows `logit_rows` (else of rows [0, logit_rows))
    int32_t table_stride = 0;
    const AttentionItem* items = nullptr;
    int32_t num_items = 0;
    int32_t max_tile_rows = 0;
    const CombineItem* combines = nullptr;
    int32_t num_combines = 0;
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    DeviceBuffer plan;  // items then combines
  };

  CudaBackend(std::shared_ptr<const Model> model, const CudaBackendOptions& options);
  absl::Status Init();
  absl::Status AllocateKvPool();
  absl::Status EnsureCapacity(int64_t tokens, int64_t seqs, int64_t logit_rows);
  bool GraphEligible(const ForwardBatch& batch) const;
  absl::Status ForwardEager(const ForwardBatch& batch);
  absl::Status ForwardGraph(const ForwardBatch& batch);
  absl::Status CaptureGraph(int batch, int context_bucket, int32_t table_stride, Graph* graph);
  absl::Status Enqueue(const StepShape& shape, const std::function<void(int64_t)>& on_layer_done);
  absl::Status FinishStep(int64_t logit_rows, float* logits);
  void DropGraphs();
  cuda::KvLayerView KvLayer(int64_t layer) const;
  uint8_t* Region(int64_t layer, int32_t block) const;
  template <class T>
  T* Staged(size_t offset) const {
    return reinterpret_cast<T*>(staging_.as<uint8_t>() + offset);
  }
  template <class T>
  T* Input(size_t offset) const {
    return reinterpret_cast<T*>(inputs_.as<uint8_t>() + offset);
  }

  std::shared_ptr<const Model> model_;
  CudaBackendOptions options_;
  KvCacheSpec spec_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<DeviceWeights> weights_;
  DeviceBuffer rope_;  // [max_positions][head_dim / 2][2] f32
  DeviceBuffer kv_;    // [layer][block][2][kv_heads][block_size][head_dim]
  int64_t max_positions_ = 0;
  int64_t table_width_ = 0;  // block-table row capacity (covers every context bucket)
  AttentionPlanOptions plan_options_;
  std::vector<int> batch_buckets_;

  // Capacities and the buffers sized from them.
  int64_t cap_tokens_ = 0, cap_seqs_ = 0, cap_rows_ = 0, cap_items_ = 0;
  InputLayout layout_;
  DeviceBuffer activations_;
  DeviceBuffer inputs_;
  PinnedBuffer staging_;
  DeviceBuffer partial_;
  DeviceBuffer gemm_scratch_;
  PinnedBuffer logits_host_;
  float *x_ = nullptr, *h_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *gate_up_ = nullptr;
  float *mlp_ = nullptr, *delta_ = nullptr, *rows_x_ = nullptr, *rows_delta_ = nullptr;
  float *rows_norm_ = nullptr, *logits_ = nullptr;

  std::map<std::pair<int, int>, Graph> graphs_;  // (batch bucket, context bucket)
  bool graphs_enabled_ = true;
  int64_t graph_steps_ = 0;
  int64_t eager_steps_ = 0;
  absl::Status sticky_;  // a failed CopyBlock, reported by the next Forward
};

}  // namespace tandem::cuda
