#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/engine/kv/tiers/tier_block.h"

namespace tandem {

// The host tier's memory on a worker whose pool is device memory: one region the backend allocated
// at start (Backend::AllocateHostMemory: page-locked on CUDA, so the block copies DMA straight into
// and out of it) cut into slots of one block payload each. A slot is taken for a block about to be
// filled (a copy-out, a disk read) and is free again once the last TierPayload using it is gone:
// a slot a copy is writing or reading, or that a load, the write-behind queue or the host tier
// holds, is never handed out again before. Thread-safe.
class HostArena : public std::enable_shared_from_this<HostArena> {
 public:
  // `memory`: `bytes` bytes (freed with the arena and its last slot); `pinned`: page-locked.
  static std::shared_ptr<HostArena> Create(std::shared_ptr<uint8_t> memory, size_t bytes,
                                           size_t slot_bytes, bool pinned);

  // A payload of slot_bytes() in a free slot, or an empty payload when every slot is taken.
  TierPayload Take();

  size_t slot_bytes() const { return slot_bytes_; }
  int64_t slots() const { return static_cast<int64_t>(stride_ == 0 ? 0 : bytes_ / stride_); }
  int64_t free_slots() const;
  // The bytes allocated, page-locked or not.
  int64_t bytes() const { return static_cast<int64_t>(bytes_); }
  bool pinned() const { return pinned_; }

 private:
  HostArena(std::shared_ptr<uint8_t> memory, size_t bytes, size_t slot_bytes, bool pinned);
  void Give(int32_t slot);

  const std::shared_ptr<uint8_t> memory_;
  const size_t bytes_;
  const size_t slot_bytes_;
  const size_t stride_;  // slot_bytes_ rounded up to 256 (each slot aligned for DMA)
  const bool pinned_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;
};

}  // namespace tandem
