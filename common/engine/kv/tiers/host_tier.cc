#include "common/engine/kv/tiers/host_tier.h"

namespace tandem {

void HostTier::Put(TierBlockPtr block) {
  const int64_t size = block->size_bytes();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(block->hash);
  if (it != index_.end()) {
    lru_.splice(lru_.end(), lru_, it->second);
    return;
  }
  if (size > capacity_) return;
  while (c_.used_bytes + size > capacity_ && !lru_.empty()) {
    c_.used_bytes -= lru_.front()->size_bytes();
    index_.erase(lru_.front()->hash);
    if (listener_ != nullptr) listener_->OnTierRemoved(KvTier::kHost, lru_.front()->hash);
    lru_.pop_front();
    ++c_.evictions;
  }
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

KvTierCounters HostTier::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvTierCounters c = c_;
  c.enabled = true;
  c.capacity_bytes = capacity_;
  c.blocks = static_cast<int64_t>(index_.size());
  return c;
}

}  // namespace tandem
