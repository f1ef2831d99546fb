#pragma once

// Whole-block copies between the device KV pool and host memory that never wait on the host:
// what Backend::StartBlockRead / StartBlockWrite / PollBlockCopy are on the CUDA backend (the KV
// tiers' copy-out at eviction and their installs). A copy is enqueued on the backend's stream, so
// it is ordered after the forward passes enqueued before it and before those enqueued after it,
// and an event recorded behind it says when it has landed (one event per copy in flight).
//
// Host memory this class handed out page-locked (AllocatePinned: the KV host tier on a GPU worker)
// is copied by DMA directly, with no host copy. Other host memory goes through a ring of
// page-locked staging slots, one block each, allocated on the first such copy: a write's source is
// copied into a slot at once, a read's slot is copied to its destination when it is polled after
// landing. What still takes the ring: blocks that are not in the host tier's memory (a GPU worker
// with a disk tier and no host tier; a block no free host-tier slot could take). Engine thread
// only, except that memory from AllocatePinned may be freed on any thread.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/backend/backend.h"
#include "common/engine/backend/cuda/cuda_util.h"

namespace tandem::cuda {

// The page-locked allocations a BlockStaging handed out, by base; freed ones removed by their
// deleter, on any thread.
class PinnedRanges {
 public:
  void Add(const uint8_t* base, size_t bytes);
  void Remove(const uint8_t* base);
  // Whether [p, p + bytes) lies inside one of them.
  bool Contains(const uint8_t* p, size_t bytes) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<const uint8_t*, size_t>> ranges_;
};

class BlockStaging {
 public:
  // `region(layer, block)`: the device address of a (layer, block) region of `layer_bytes`.
  // `bytes`: the staging slots' budget (at least one slot).
  BlockStaging(cudaStream_t stream, int64_t num_layers, size_t layer_bytes, size_t bytes,
               std::function<uint8_t*(int64_t, int32_t)> region);
  ~BlockStaging();  // waits for the copies in flight (they use the slots and the callers' memory)
  BlockStaging(const BlockStaging&) = delete;
  BlockStaging& operator=(const BlockStaging&) = delete;

  // `bytes` of page-locked host memory (cudaMallocHost), which the copies below DMA directly;
  // RESOURCE_EXHAUSTED when that much cannot be pinned. Freed (cudaFreeHost) with its last
  // reference, which may outlive this object.
  absl::StatusOr<HostMemory> AllocatePinned(size_t bytes);

  // Enqueues the copy of `block` into `dst` (num_layers * layer_bytes): directly when `dst` is
  // memory from AllocatePinned (it is written until the copy landed), else into a free staging
  // slot. Its ticket, or nullopt when no staging slot is free (or the slots, an event or the
  // enqueue failed: logged).
  std::optional<uint64_t> StartRead(int32_t block, uint8_t* dst);
  // Enqueues the copy of `src` (num_layers * layer_bytes) into `block`: directly when `src` is
  // memory from AllocatePinned (it is read until the copy landed: the caller keeps it unchanged),
  // else copied into a free staging slot at once. Its ticket, or nullopt as StartRead.
  std::optional<uint64_t> StartWrite(int32_t block, const uint8_t* src);
  // Whether copy `ticket` has landed (a staged read: its bytes copied to its destination now);
  // a landed copy's ticket ends, its slot and event are free again. `wait`: waits for its event
  // instead (never the stream). An error of the copy ends it too. Unknown tickets are an error.
  absl::StatusOr<bool> Poll(uint64_t ticket, bool wait);

  int64_t slots_in_use() const;
  int64_t copies_in_flight() const { return static_cast<int64_t>(copies_.size()); }
  // Copies by DMA to or from AllocatePinned memory, copies through a staging slot, and the bytes
  // the host copied between staging slots and callers' memory for the latter (cumulative).
  int64_t direct_copies() const { return direct_copies_; }
  int64_t staged_copies() const { return staged_copies_; }
  int64_t staged_host_bytes() const { return staged_host_bytes_; }

 private:
  struct Copy {
    cudaEvent_t done = nullptr;
    int slot = -1;           // staging slot; -1: a direct copy
    uint8_t* dst = nullptr;  // a staged read: where its bytes go once landed
  };
  bool EnsureSlots();
  int TakeSlot();  // a free staging slot, or -1
  cudaEvent_t TakeEvent();
  uint8_t* SlotData(int slot) const { return buffer_.as<uint8_t>() + slot * block_bytes(); }
  size_t block_bytes() const { return static_cast<size_t>(num_layers_) * layer_bytes_; }
  // Enqueues the per-layer copies of `block` from (read) or into (write) `host`, then `done`.
  cudaError_t Enqueue(uint8_t* host, int32_t block, bool read, cudaEvent_t done);
  // Enqueues a copy and keeps it under a new ticket; `slot` (or -1) and the event are given back
  // when the enqueue fails.
  std::optional<uint64_t> Start(int32_t block, uint8_t* host, bool read, int slot, uint8_t* dst);

  cudaStream_t stream_;
  int64_t num_layers_;
  size_t layer_bytes_;
  size_t budget_;
  std::function<uint8_t*(int64_t, int32_t)> region_;
  std::shared_ptr<PinnedRanges> pinned_ = std::make_shared<PinnedRanges>();
  bool slots_failed_ = false;  // staging allocation failed: no slots, ever
  PinnedBuffer buffer_;
  std::vector<bool> slot_busy_;
  std::vector<cudaEvent_t> free_events_;
  std::unordered_map<uint64_t, Copy> copies_;  // in flight, by ticket
  uint64_t next_ticket_ = 1;
  int64_t direct_copies_ = 0;
  int64_t staged_copies_ = 0;
  int64_t staged_host_bytes_ = 0;
};

}  // namespace tandem::cuda
