#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/engine/kv/tiers/host_arena.h"
#include "common/engine/kv/tiers/tier_block.h"
#include "common/engine/kv/tiers/tier_options.h"

namespace tandem {

// The host-memory tier: blocks by hash, least recently used evicted first, within a byte
// capacity. A block is kept once whatever number of prefixes share it (content-addressed).
// With an arena (a worker whose pool is device memory) the tier's memory is the arena's: blocks
// are filled in its slots (TakeSlot) and only such blocks are kept. Without one (a CPU worker)
// blocks are kept in the heap memory they come in. Thread-safe.
class HostTier {
 public:
  // `listener` (may be null) hears every block kept and dropped.
  explicit HostTier(int64_t capacity_bytes, KvTierListener* listener = nullptr,
                    std::shared_ptr<HostArena> arena = nullptr)
      : capacity_(capacity_bytes), listener_(listener), arena_(std::move(arena)) {}

  // Keeps `block` (most recently used), evicting the least recently used ones to fit. A block
  // larger than the whole capacity, or (with an arena) not in one of its slots, is not kept.
  // Already here: only touched.
  void Put(TierBlockPtr block);
  // The block under `hash` (touched), or null. Counts a hit or a miss.
  TierBlockPtr Get(BlockHash hash);
  bool Contains(BlockHash hash) const;
  // Marks `hash` most recently used; false when absent.
  bool Touch(BlockHash hash);
  // A payload of `bytes` in an arena slot for a block about to be filled: a free slot, else the
  // slot of the least recently used block nothing but this tier holds (evicted for it). Empty
  // without an arena, for another size, or when every slot is held elsewhere (loads, the
  // write-behind queue, copies in flight).
  TierPayload TakeSlot(size_t bytes);
  KvTierCounters counters() const;

 private:
  using Lru = std::list<TierBlockPtr>;  // front: least recently used
  void EvictLocked(Lru::iterator it);

  const int64_t capacity_;
  KvTierListener* const listener_;
  const std::shared_ptr<HostArena> arena_;
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<BlockHash, Lru::iterator> index_;
  KvTierCounters c_;
};

}  // namespace tandem
