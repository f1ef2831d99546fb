#include "common/engine/kv/tiers/host_arena.h"

#include <utility>

namespace tandem {

std::shared_ptr<HostArena> HostArena::Create(std::shared_ptr<uint8_t> memory, size_t bytes,
                                             size_t slot_bytes, bool pinned) {
  return std::shared_ptr<HostArena>(new HostArena(std::move(memory), bytes, slot_bytes, pinned));
}

HostArena::HostArena(std::shared_ptr<uint8_t> memory, size_t bytes, size_t slot_bytes, bool pinned)
    : memory_(std::move(memory)),
      bytes_(bytes),
      slot_bytes_(slot_bytes),
      stride_((slot_bytes + 255) / 256 * 256),
      pinned_(pinned) {
  // Highest first: Take hands out the lowest free slot.
  for (int64_t i = slots() - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

TierPayload HostArena::Take() {
  int32_t slot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return {};
    slot = free_.back();
    free_.pop_back();
  }
  uint8_t* data = memory_.get() + static_cast<size_t>(slot) * stride_;
  // The lease gives the slot back when the last payload sharing it is gone.
  std::shared_ptr<void> lease(data, [self = shared_from_this(), slot](void*) { self->Give(slot); });
  return TierPayload(data, slot_bytes_, std::move(lease));
}

void HostArena::Give(int32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(slot);
}

int64_t HostArena::free_slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

}  // namespace tandem
