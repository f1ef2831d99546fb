#pragma once

// LoRA adapters on the device for the CUDA backend's forward pass (lora_kernels.h for the
// products). An adapter's matrices are uploaded when a step first uses it (one allocation: its
// entry table [layers * kNumLoraTargets], then every A and B in the adapter's own dtype) and
// freed once the adapter itself is gone: entries hold a weak reference to the host adapter
// (LoraAdapter is shared by the registry and the sequences using it, common/engine/lora/README.md),
// and every step first frees the device copies of adapters nobody holds any more (after waiting
// for the stream, so no launched step still reads them). Engine thread only, like the backend.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/model_config.h"
#include "common/engine/backend/backend.h"
#include "common/engine/backend/cuda/cuda_util.h"
#include "common/engine/backend/cuda/gemm.h"
#include "common/engine/backend/cuda/lora_kernels.h"
#include "common/engine/lora/lora_adapter.h"

namespace tandem::cuda {

class DeviceLora {
 public:
  explicit DeviceLora(const ModelConfig& config) : config_(config) {}

  // Frees the device copies of adapters no longer alive, then, when a sequence of `batch` has an
  // adapter, uploads the adapters not on the device yet and stages the step's token -> adapter
  // map (`padded_tokens` rows, the padding on the base model) and adapter groups into
  // `slot`'s host staging (0 or 1: a launched step's staging stays untouched until the next step
  // of the other slot) and copies them to the device on `stream`. Returns whether the step has
  // adapters (Add is a no-op otherwise). An adapter whose shapes are not this model's is refused.
  absl::StatusOr<bool> Prepare(const ForwardBatch& batch, int slot, int64_t padded_tokens,
                               cudaStream_t stream);

  // y[t, 0:n] (f32, row stride ldy) += the LoRA term of (layer, target) for the rows x (k
  // columns) of every token of the prepared step whose adapter targets it.
  absl::Status Add(int64_t layer, LoraTarget target, const GemmInput& x, int64_t k, float* y,
                   int64_t ldy, int64_t n, cudaStream_t stream);

  // Adapters on the device now, their bytes, and uploads so far (tests).
  int64_t resident() const { return static_cast<int64_t>(resident_.size()); }
  size_t resident_bytes() const;
  int64_t uploads() const { return uploads_; }

 private:
  struct Resident {
    std::weak_ptr<const LoraAdapter> owner;  // empty: not shared-owned, dropped after its step
    DeviceBuffer buffer;
    const LoraDeviceEntry* table = nullptr;
  };
  absl::Status Upload(const LoraAdapter& adapter, Resident* r);
  absl::Status CheckShapes(const LoraAdapter& adapter) const;
  absl::Status Sweep(cudaStream_t stream);

  const ModelConfig config_;
  std::map<const LoraAdapter*, Resident> resident_;
  int64_t uploads_ = 0;
  // The prepared step.
  int64_t tokens_ = 0;
  int32_t max_rank_ = 0;
  std::vector<uint8_t> staging_[2];
  DeviceBuffer step_;  // group_of_token [tokens] int32, then the groups
  size_t groups_offset_ = 0;
  DeviceBuffer low_;  // the shrink's output [tokens, max_rank] f32
};

}  // namespace tandem::cuda
