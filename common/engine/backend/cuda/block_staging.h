#pragma once

// Whole-block copies between the device KV pool and host memory that never wait on the host:
// what Backend::StartBlockRead / PollBlockRead / StartBlockWrite are on the CUDA backend (the KV
// tiers' copy-out at eviction and their installs). A ring of page-locked slots, one block (every
// layer's region, layer after layer) each, allocated on first use; a copy is enqueued on the
// backend's stream, so it is ordered after the forward passes enqueued before it and before those
// enqueued after it, and an event recorded behind it says when it has landed. Engine thread only.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/backend/cuda/cuda_util.h"

namespace tandem::cuda {

class BlockStaging {
 public:
  // `region(layer, block)`: the device address of a (layer, block) region of `layer_bytes`.
  // `bytes`: the slots' budget (at least one slot).
  BlockStaging(cudaStream_t stream, int64_t num_layers, size_t layer_bytes, size_t bytes,
               std::function<uint8_t*(int64_t, int32_t)> region);
  ~BlockStaging();  // waits for the copies in flight (they use the slots)
  BlockStaging(const BlockStaging&) = delete;
  BlockStaging& operator=(const BlockStaging&) = delete;

  // Enqueues the copy of `block` into a free slot; its ticket, or nullopt when every slot is in
  // use (or the slots could not be allocated: logged once).
  std::optional<uint64_t> StartRead(int32_t block);
  // Once the read `ticket` has landed: copies it to `dst` (num_layers * layer_bytes), frees its
  // slot and returns true. False while it is in flight (`wait`: waits for it instead). An error
  // of the copy frees the slot too. Unknown tickets are an error.
  absl::StatusOr<bool> PollRead(uint64_t ticket, uint8_t* dst, bool wait);
  // Copies `src` (num_layers * layer_bytes) into a free slot and enqueues its copy into `block`;
  // the slot is free again once that has landed. False when no slot is free.
  bool StartWrite(int32_t block, const uint8_t* src);

  int64_t slots_in_use() const;

 private:
  enum class State { kFree, kRead, kWrite };
  struct Slot {
    cudaEvent_t done = nullptr;
    State state = State::kFree;
    uint64_t ticket = 0;
  };
  bool EnsureAllocated();
  // A free slot (finished writes are freed first), or -1.
  int TakeSlot();
  uint8_t* SlotData(int slot) const { return buffer_.as<uint8_t>() + slot * block_bytes(); }
  size_t block_bytes() const { return static_cast<size_t>(num_layers_) * layer_bytes_; }
  // Enqueues the per-layer copies of `block` from (read) or into (write) `slot`, then its event.
  cudaError_t Enqueue(int slot, int32_t block, bool read);

  cudaStream_t stream_;
  int64_t num_layers_;
  size_t layer_bytes_;
  size_t budget_;
  std::function<uint8_t*(int64_t, int32_t)> region_;
  bool failed_ = false;  // allocation failed: no slots, ever
  PinnedBuffer buffer_;
  std::vector<Slot> slots_;
  uint64_t next_ticket_ = 1;
};

}  // namespace tandem::cuda
