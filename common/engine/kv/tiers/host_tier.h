#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>

#include "common/engine/kv/tiers/tier_block.h"
#include "common/engine/kv/tiers/tier_options.h"

namespace tandem {

// The host-memory tier: blocks by hash, least recently used evicted first, within a byte
// capacity. A block is kept once whatever number of prefixes share it (content-addressed).
// Thread-safe.
class HostTier {
 public:
  // `listener` (may be null) hears every block kept and dropped.
  explicit HostTier(int64_t capacity_bytes, KvTierListener* listener = nullptr)
      : capacity_(capacity_bytes), listener_(listener) {}

  // Keeps `block` (most recently used), evicting the least recently used ones to fit. A block
  // larger than the whole capacity is not kept. Already here: only touched.
  void Put(TierBlockPtr block);
  // The block under `hash` (touched), or null. Counts a hit or a miss.
  TierBlockPtr Get(BlockHash hash);
  bool Contains(BlockHash hash) const;
  // Marks `hash` most recently used; false when absent.
  bool Touch(BlockHash hash);
  KvTierCounters counters() const;

 private:
  using Lru = std::list<TierBlockPtr>;  // front: least recently used
  const int64_t capacity_;
  KvTierListener* const listener_;
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<BlockHash, Lru::iterator> index_;
  KvTierCounters c_;
};

}  // namespace tandem
