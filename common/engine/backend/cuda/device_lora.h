#pragma once

// LoRA adapters on the device for the CUDA backend's forward pass (lora_kernels.h for the
// products). The device memory for adapters is reserved when the backend is made, before the
// KV pool takes what is left (vLLM's slots): `slots` (--max-loras) slots, each large enough for
// an adapter of rank max_rank on every target in the reserved dtype. An adapter is copied into
// a slot when a step first uses it (its entry table [layers * kNumLoraTargets], then every A and
// B) and keeps the slot while it is alive; a step needing a slot when none is free takes the
// least recently used one of an adapter the step does not use (after waiting for the stream, so
// no launched step still reads it). Slots of adapters nobody holds any more (entries hold a weak
// reference to the host adapter, shared by the registry and the sequences using it,
// common/engine/lora/README.md) are freed first. No step allocates device memory for an adapter,
// so serving adapters never fails for memory the KV cache took. Engine thread only, like the
// backend.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/config/model_config.h"
#include "common/engine/backend/backend.h"
#include "common/engine/backend/cuda/cuda_util.h"
#include "common/engine/backend/cuda/gemm.h"
#include "common/engine/backend/cuda/lora_kernels.h"
#include "common/engine/lora/lora_adapter.h"

namespace tandem::cuda {

struct DeviceLoraOptions {
  int64_t slots = 1;      // adapters on the device at once (--max-loras)
  int64_t max_rank = 16;  // --max-lora-rank
  // What adapters are kept in (--lora-dtype, resolved): a slot holds max_rank on every target in
  // this dtype; an adapter in a wider dtype fits when its bytes do (a lower rank).
  DType dtype = DType::kBF16;
  // Tokens of the largest step the step buffers are sized for at once (larger steps grow them).
  int64_t max_tokens = 2048;
};

class DeviceLora {
 public:
  // Reserves the slots and the step buffers on the current device.
  static absl::StatusOr<std::unique_ptr<DeviceLora>> Create(const ModelConfig& config,
                                                            const DeviceLoraOptions& options);

  // The bytes of one slot for `config` and `options` (what Create reserves per slot).
  static size_t SlotBytes(const ModelConfig& config, const DeviceLoraOptions& options);

  // Frees the slots of adapters no longer alive, then, when a sequence of `batch` has an
  // adapter, copies the adapters not on the device yet into slots and stages the step's token ->
  // adapter map (`padded_tokens` rows, the padding on the base model) and adapter groups into
  // `slot`'s host staging (0 or 1: a launched step's staging stays untouched until the next step
  // of the other slot) and copies them to the device on `stream`. Returns whether the step has
  // adapters (Add is a no-op otherwise). An adapter whose shapes are not this model's, or that
  // does not fit a slot, is refused, as is a step with more adapters than slots.
  absl::StatusOr<bool> Prepare(const ForwardBatch& batch, int slot, int64_t padded_tokens,
                               cudaStream_t stream);

  // y[t, 0:n] (f32, row stride ldy) += the LoRA term of (layer, target) for the rows x (k
  // columns) of every token of the prepared step whose adapter targets it.
  absl::Status Add(int64_t layer, LoraTarget target, const GemmInput& x, int64_t k, float* y,
                   int64_t ldy, int64_t n, cudaStream_t stream);

  const DeviceLoraOptions& options() const { return options_; }
  // Adapters on the device now, the device bytes reserved for adapters and steps, and the
  // uploads so far (tests).
  int64_t resident() const { return static_cast<int64_t>(resident_.size()); }
  size_t reserved_bytes() const { return slots_.bytes() + step_.bytes() + low_.bytes(); }
  int64_t uploads() const { return uploads_; }

 private:
  DeviceLora(const ModelConfig& config, const DeviceLoraOptions& options, size_t slot_bytes)
      : config_(config), options_(options), slot_bytes_(slot_bytes) {}

  struct Resident {
    std::weak_ptr<const LoraAdapter> owner;
    int64_t slot = 0;
    int64_t last_used = 0;  // the step counter when a step last used it
  };
  absl::Status Upload(const LoraAdapter& adapter, int64_t slot);
  absl::Status CheckShapes(const LoraAdapter& adapter) const;
  // Frees the slots of adapters that are gone; `*synced` once the stream was waited for.
  absl::Status Sweep(cudaStream_t stream, bool* synced);
  // A free slot for an adapter of this step (`step` its adapters), evicting the least recently
  // used adapter the step does not use when none is free.
  absl::StatusOr<int64_t> TakeSlot(const std::vector<const LoraAdapter*>& step, cudaStream_t stream,
                                   bool* synced);
  const LoraDeviceEntry* Table(int64_t slot) const {
    return reinterpret_cast<const LoraDeviceEntry*>(slots_.as<uint8_t>() + slot * slot_bytes_);
  }

  const ModelConfig config_;
  const DeviceLoraOptions options_;
  const size_t slot_bytes_;
  DeviceBuffer slots_;  // options_.slots slots of slot_bytes_
  std::vector<int64_t> free_slots_;
  std::map<const LoraAdapter*, Resident> resident_;
  int64_t uploads_ = 0;
  int64_t steps_ = 0;
  // The prepared step.
  int64_t tokens_ = 0;
  int32_t max_rank_ = 0;
  std::vector<uint8_t> staging_[2];
  std::vector<uint8_t> upload_staging_;
  DeviceBuffer step_;  // group_of_token [tokens] int32, then the groups
  size_t groups_offset_ = 0;
  DeviceBuffer low_;  // the shrink's output [tokens, max_rank] f32
};

}  // namespace tandem::cuda
