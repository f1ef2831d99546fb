#pragma once

// The CUDA backend's class (internal: use cuda_backend.h). Tests include it for the counters.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "common/engine/backend/cuda/attention_plan.h"
#include "common/engine/backend/cuda/block_staging.h"
#include "common/engine/backend/cuda/cuda_backend.h"
#include "common/engine/backend/cuda/cuda_util.h"
#include "common/engine/backend/cuda/device_lora.h"
#include "common/engine/backend/cuda/device_weights.h"
#include "common/engine/backend/cuda/gemm.h"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda {

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(std::shared_ptr<const Model> model,
                                                             const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  const KvCacheSpec& kv_spec() const override { return spec_; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  absl::Status CheckLora(int64_t max_loras, int64_t max_rank, DType dtype) const override;
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  bool SupportsDeviceSampling() const override { return true; }
  absl::Status ForwardSampled(const ForwardBatch& batch,
                              const std::vector<DeviceSampleRow>& samples, float* logits,
                              std::vector<DeviceSample>* results) override;
  bool SupportsAsyncSteps() const override { return true; }
  absl::Status LaunchStep(const ForwardBatch& batch, const std::vector<DeviceSampleRow>& samples,
                          const std::vector<DeviceTokenInput>& device_tokens) override;
  absl::Status CollectStep(float* logits, std::vector<DeviceSample>* results) override;
  int pending_steps() const override { return static_cast<int>(pending_.size()); }
  bool SupportsRemoteKv() const override { return true; }
  void CopyBlock(int32_t src, int32_t dst) override;
  uint8_t* HostBlockRegion(int64_t layer, int32_t block) override { return nullptr; }
  absl::Status ReadBlockRegion(int64_t layer, int32_t block, uint8_t* dst) override;
  absl::Status WriteBlockRegion(int64_t layer, int32_t block, const uint8_t* src) override;
  absl::StatusOr<HostMemory> AllocateHostMemory(size_t bytes) override;  // page-locked
  bool SupportsAsyncBlockCopies() const override { return true; }
  std::optional<uint64_t> StartBlockRead(int32_t block, uint8_t* dst) override;
  std::optional<uint64_t> StartBlockWrite(int32_t block, const uint8_t* src) override;
  absl::StatusOr<bool> PollBlockCopy(uint64_t ticket, bool wait) override;
  // The whole-block copies so far (tests): direct DMA, staged, and host bytes through staging.
  const BlockStaging& block_copies() { return Staging(); }

  // Device address of a (layer, block) region (see CudaDeviceBlockRegion).
  uint8_t* DeviceBlockRegion(int64_t layer, int32_t block) const { return Region(layer, block); }
  // See CudaKvLayerReadyEvent.
  void* KvLayerReadyEvent(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(layer_events_.size()) ? layer_events_[layer]
                                                                            : nullptr;
  }

  // Statistics for tests and benchmarks.
  int64_t graphs_captured() const {
    return static_cast<int64_t>(body_graphs_.size() + head_graphs_.size());
  }
  int64_t graph_steps() const { return graph_steps_; }
  int64_t eager_steps() const { return eager_steps_; }
  int64_t device_sampled_rows() const { return device_sampled_rows_; }
  // Steps launched while an earlier one was still launched and not collected (overlap), and the
  // input tokens taken from the previous step's device samples.
  int64_t overlapped_launches() const { return overlapped_launches_; }
  int64_t device_input_tokens() const { return device_input_tokens_; }
  size_t weight_bytes() const { return weights_->bytes(); }
  // LoRA adapters on the device (null without CudaBackendOptions::lora_slots).
  const DeviceLora* lora() const { return lora_.get(); }
  size_t kv_pool_bytes() const { return kv_.bytes(); }
  bool bf16_activations() const { return act_bf16_; }
  const Gemm& gemm() const { return *gemm_; }
  // Token-count buckets of the graphs (layers per token bucket, logits per row bucket).
  const std::vector<int>& graph_buckets() const { return buckets_; }

 private:
  // Offsets (bytes) of one step's inputs, identical in the pinned staging buffer and on the
  // device. `counts` and `rows` sit at fixed offsets (the logits graphs read them whatever the
  // layers' bucket); the per-token arrays, attention items and merges follow, sized for the
  // step's `tokens` rows; the block tables come last, as long as the step needs.
  struct InputLayout {
    size_t counts = 0, rows = 0, tokens = 0, positions = 0, context_lens = 0, slots = 0;
    size_t items = 0, combines = 0, tables = 0;
  };
  // What one forward enqueues for `tokens` rows of layers and `logit_rows` rows of logits (a
  // graph's buckets, or the step's own sizes).
  struct StepShape {
    int64_t tokens = 0;
    int64_t logit_rows = 0;
    InputLayout layout;
    int32_t grid_items = 0;
    int32_t grid_combines = 0;
    int32_t max_tile_rows = 0;
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
  };
  // What one launched step owns until it is collected (two, used in turn, so that the next step
  // stages while this one runs): its pinned input staging, the pinned landing of the rows and
  // samples coming back, its samples' answers on the device (the next step's input tokens may be
  // gathered from them), and the event recorded behind its last copy.
  struct StepSlot {
    PinnedBuffer staging;  // the step's inputs, offsets as in inputs_
    PinnedBuffer logits_host;
    PinnedBuffer sample_staging;
    DeviceBuffer sample_out;
    PinnedBuffer sample_out_host;
    cudaEvent_t done = nullptr;
    // The launched step, until CollectStep: rows copied back and what each sample asked for.
    int64_t host_rows = 0;
    std::vector<DeviceSampleRow> samples;  // logit_row and logprobs only
  };

  CudaBackend(std::shared_ptr<const Model> model, const CudaBackendOptions& options);
  absl::Status Init();
  absl::Status AllocateKvPool();
  absl::Status EnsureCapacity(int64_t tokens, int64_t seqs, int64_t logit_rows);
  InputLayout Layout(int64_t tokens) const;
  int64_t ItemsCapacity(int64_t tokens) const;
  StepShape GraphShape(int64_t tokens, int64_t logit_rows) const;
  bool GraphEligible(const ForwardBatch& batch) const;
  // Fills the staging buffer for `batch` padded to `tokens` and `logit_rows` rows and uploads it.
  // `device_tokens` are then gathered from `prev_samples` (the previous step's answers on the
  // device) into the uploaded token ids.
  absl::StatusOr<StepShape> Stage(const ForwardBatch& batch,
                                  const std::vector<DeviceTokenInput>& device_tokens,
                                  const SampleOutput* prev_samples, int64_t tokens,
                                  int64_t logit_rows, bool graph);
  // Validates the batch and enqueues its forward pass (graphs or eager), up to the logits.
  absl::Status EnqueueStep(const ForwardBatch& batch,
                           const std::vector<DeviceTokenInput>& device_tokens,
                           const SampleOutput* prev_samples);
  // Stages and enqueues the sampling of `samples` over the step's logits (cuda_sampling.cc).
  absl::Status EnqueueSampling(const std::vector<DeviceSampleRow>& samples);
  absl::Status CaptureGraphs();
  absl::Status Capture(bool body, int bucket, Graph* graph);
  // `lora`: the step's LoRA terms (lora_ prepared for it; such steps run eagerly).
  absl::Status EnqueueLayers(const StepShape& shape,
                             const std::function<void(int64_t)>& on_layer_done, bool lora = false);
  absl::Status EnqueueLogits(const StepShape& shape);
  // The slot the next step stages into, its host buffers grown to the capacities.
  absl::Status PrepareSlot();
  void DropGraphs();
  cuda::KvLayerView KvLayer(int64_t layer) const;
  uint8_t* Region(int64_t layer, int32_t block) const;
  BlockStaging& Staging();  // block_staging_, made on first use
  template <class T>
  T* Staged(size_t offset) const {
    return reinterpret_cast<T*>(slots_[cur_].staging.as<uint8_t>() + offset);
  }
  template <class T>
  T* Input(size_t offset) const {
    return reinterpret_cast<T*>(inputs_.as<uint8_t>() + offset);
  }

  std::shared_ptr<const Model> model_;
  CudaBackendOptions options_;
  KvCacheSpec spec_;
  bool act_bf16_ = false;  // matmul inputs in bf16 (bf16 weights and options.bf16_activations)
  cudaStream_t stream_ = nullptr;
  // The remote pool of the step being enqueued (ForwardBatch::remote_kv; eager steps only), into
  // KvLayer's remote_base. Null outside EnqueueStep.
  const RemoteKvPool* step_remote_ = nullptr;
  // Per layer, recorded after its KV writes in a step with an export hook (Init creates them).
  std::vector<cudaEvent_t> layer_events_;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<DeviceWeights> weights_;
  DeviceBuffer rope_;                 // [max_positions][head_dim / 2][2] f32
  std::unique_ptr<DeviceLora> lora_;  // LoRA adapters on the device (lora_slots > 0)
  DeviceBuffer kv_;                   // [layer][block][2][kv_heads][block_size][head_dim]
  int64_t max_positions_ = 0;
  int64_t table_width_ = 0;  // block-table row capacity (covers every position)
  AttentionPlanOptions plan_options_;
  std::vector<int> buckets_;

  // Capacities and the buffers sized from them.
  int64_t cap_tokens_ = 0, cap_seqs_ = 0, cap_rows_ = 0;
  DeviceBuffer activations_;
  DeviceBuffer inputs_;
  size_t input_bytes_ = 0;  // of inputs_ and of each slot's staging
  DeviceBuffer partial_;
  DeviceBuffer gemm_scratch_;
  // Residual stream, its per-layer update and the fused q/k/v rows: f32. Matmul inputs (h_: the
  // normalized rows, attn_, mlp_, rows_norm_: the logit rows' final norm): bf16 when act_bf16_,
  // else f32. gate_up_: f32 scratch of the unfused SiLU path.
  float *x_ = nullptr, *delta_ = nullptr, *qkv_ = nullptr, *gate_up_ = nullptr;
  float* logits_ = nullptr;
  void *h_ = nullptr, *attn_ = nullptr, *mlp_ = nullptr, *rows_norm_ = nullptr;

  std::map<int, Graph> body_graphs_;  // the layers, by token bucket
  std::map<int, Graph> head_graphs_;  // final norm and logits, by logit-row bucket
  bool graphs_enabled_ = true;
  bool graphs_stale_ = false;  // buffers grew since the capture
  int64_t graph_steps_ = 0;
  int64_t eager_steps_ = 0;
  absl::Status sticky_;  // a failed CopyBlock, reported by the next Forward
  // The asynchronous whole-block copies and their pinned staging (made on first use).
  std::unique_ptr<BlockStaging> block_staging_;

  // Sampling on the device (cuda_sampling.cc): the rows' inputs (the slot's pinned staging and
  // this device copy, identical offsets), the processed rows; the answers are the slot's.
  DeviceBuffer sample_inputs_;
  DeviceBuffer sample_work_;
  int64_t device_sampled_rows_ = 0;

  // Launched steps (LaunchStep / CollectStep): the two slots, the one the next step uses, the
  // launched ones not collected (oldest first), and the slot whose samples the next step may
  // take input tokens from (-1: none) with their count.
  StepSlot slots_[2];
  int cur_ = 0;
  std::deque<int> pending_;
  int last_sampled_slot_ = -1;
  int64_t last_samples_ = 0;
  int64_t overlapped_launches_ = 0;
  int64_t device_input_tokens_ = 0;
};

}  // namespace tandem::cuda
