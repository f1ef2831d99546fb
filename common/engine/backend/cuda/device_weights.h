#pragma once

// The model's weights copied once to device memory (one allocation), in the layout the CUDA
// forward pass wants: q/k/v projections concatenated into one [q + 2 kv, hidden] matrix (and
// their biases into one vector), gate/up into one [2 ffn, hidden] matrix. Element types are the
// host model's (f32 or bf16 projections, f32 norms and biases). A tied lm_head shares the
// embedding's device copy. Weight-only quantized projections and lm_head (int8, int4 made at
// load or from AWQ / GPTQ checkpoints; the embedding stays dense) keep the host's row layout for
// their codes, stacked the same way, with their scales after them (quant_kernels.h), and share
// one dequantization scratch region (gemm.h) at the end of the allocation.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/backend/cuda/cuda_util.h"
#include "common/engine/backend/cuda/gemm.h"
#include "common/engine/model/model.h"

namespace tandem::cuda {

struct DeviceLayer {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  DeviceMatrix qkv;
  const float* qkv_bias = nullptr;  // null when the model has no q/k/v bias
  DeviceMatrix o;
  DeviceMatrix gate_up;
  DeviceMatrix down;
};

class DeviceWeights {
 public:
  // Uploads with synchronous copies on the current device. Refuses what CheckQuantized refuses.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Upload(const Model& model);
  // Whether the model's quantized weights are ones the CUDA backend serves: row layout (kRows),
  // no act-order input permutation, each fused group (q/k/v, gate/up) in one format. One line
  // saying what is not served otherwise.
  static absl::Status CheckQuantized(const Model& model);

  const DeviceMatrix& embed() const { return embed_; }
  const DeviceMatrix& lm_head() const { return lm_head_; }
  const float* final_norm() const { return final_norm_; }
  const std::vector<DeviceLayer>& layers() const { return layers_; }
  size_t bytes() const { return buffer_.bytes(); }

 private:
  DeviceWeights() = default;

  DeviceBuffer buffer_;
  DeviceMatrix embed_;
  DeviceMatrix lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<DeviceLayer> layers_;
};

}  // namespace tandem::cuda
