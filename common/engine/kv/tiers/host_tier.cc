#include "common/engine/kv/tiers/host_tier.h"

namespace tandem {

void HostTier::EvictLocked(Lru::iterator it) {
  const TierBlockPtr block = std::move(*it);
  lru_.erase(it);
  c_.used_bytes -= block->size_bytes();
  index_.erase(block->hash);
  if (listener_ != nullptr) listener_->OnTierRemoved(KvTier::kHost, block->hash);
  ++c_.evictions;
}

void HostTier::Put(TierBlockPtr block) {
  const int64_t size = block->size_bytes();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(block->hash);
  if (it != index_.end()) {
    lru_.splice(lru_.end(), lru_, it->second);
    return;
  }
  if (size > capacity_ || (arena_ != nullptr && !block->payload.in_arena())) return;
  while (c_.used_bytes + size > capacity_ && !lru_.empty()) EvictLocked(lru_.begin());
  c_.used_bytes += size;
  c_.bytes_in += size;
  const BlockHash hash = block->hash;
  index_[hash] = lru_.insert(lru_.end(), std::move(block));
  if (listener_ != nullptr) listener_->OnTierStored(KvTier::kHost, hash);
}

TierBlockPtr HostTier::Get(BlockHash hash) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) {
    ++c_.misses;
    return nullptr;
  }
  lru_.splice(lru_.end(), lru_, it->second);
  ++c_.hits;
  TierBlockPtr block = *it->second;
  c_.bytes_out += block->size_bytes();
  return block;
}

bool HostTier::Contains(BlockHash hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(hash) != 0;
}

bool HostTier::Touch(BlockHash hash) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second);
  return true;
}

TierPayload HostTier::TakeSlot(size_t bytes) {
  if (arena_ == nullptr || bytes != arena_->slot_bytes()) return {};
  if (TierPayload p = arena_->Take(); !p.empty()) return p;
  std::lock_guard<std::mutex> lock(mu_);
  while (true) {
    // Only this tier's reference: evicting it frees its slot (anything else holding the block,
    // a load or the write-behind queue, may be reading it, or a copy writing or reading it).
    auto it = lru_.begin();
    while (it != lru_.end() && it->use_count() != 1) ++it;
    if (it == lru_.end()) return {};
    EvictLocked(it);
    // Another thread may take the freed slot first: then evict the next.
    if (TierPayload p = arena_->Take(); !p.empty()) return p;
  }
}

KvTierCounters HostTier::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvTierCounters c = c_;
  c.enabled = true;
  c.capacity_bytes = capacity_;
  c.pinned_bytes = arena_ != nullptr && arena_->pinned() ? arena_->bytes() : 0;
  c.blocks = static_cast<int64_t>(index_.size());
  return c;
}

}  // namespace tandem
