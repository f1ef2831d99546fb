#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"
#include "common/cluster/block_hash.h"

namespace tandem {

// Bookkeeping for the paged KV pool: which block ids are free, referenced (by how many
// sequences) or cached (a full block registered in the prefix cache under its hash). The bytes
// live in the backend; this class only hands out ids.
//
// States of a block:
//   free        refcount 0, no hash                         -> on the free list
//   referenced  refcount > 0, with or without a hash
//   evictable   refcount 0, with a hash (prefix cache)      -> on the LRU list, reusable
// Allocate() prefers free blocks and otherwise evicts the least recently released evictable
// block (its hash leaves the cache). Not thread-safe: owned by the engine thread.
class BlockPool {
 public:
  struct Listener {
    std::function<void(BlockHash)> on_stored;   // a hash entered the prefix cache
    std::function<void(BlockHash)> on_removed;  // a hash left it (evicted or cleared)
  };

  BlockPool(int64_t num_blocks, bool enable_prefix_cache);

  int64_t num_blocks() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t num_available() const { return static_cast<int64_t>(free_.size()) + num_evictable_; }
  int64_t num_referenced() const { return num_referenced_; }
  int64_t num_evictable() const { return num_evictable_; }
  int64_t num_cached() const { return static_cast<int64_t>(by_hash_.size()); }
  // Cached blocks evicted so far to make room (not counting ClearCache).
  int64_t num_evictions() const { return num_evictions_; }
  bool prefix_cache_enabled() const { return prefix_cache_; }

  // A block with refcount 1, or nullopt when every block is referenced.
  std::optional<int32_t> Allocate();
  void AddRef(int32_t block);
  // Drops one reference. At zero a cached block becomes evictable (most recently used end of
  // the LRU list); an uncached one returns to the free list.
  void Release(int32_t block);
  int32_t refcount(int32_t block) const { return refcount_[block]; }

  // Prefix cache. Lookup finds the block registered under `hash` whose recorded parent hash,
  // tokens and salt equal the arguments (so a 64-bit collision can never return wrong KV) and
  // takes a reference on it.
  std::optional<int32_t> AcquireCached(BlockHash hash, BlockHash parent,
                                       absl::Span<const int32_t> tokens, uint64_t salt_hash);
  // Whether a matching block is cached, without taking it.
  bool IsCached(BlockHash hash) const { return by_hash_.count(hash) != 0; }
  // The block cached under `hash`, without taking it.
  std::optional<int32_t> CachedBlock(BlockHash hash) const {
    auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) return std::nullopt;
    return it->second;
  }
  // Registers a full, referenced block under `hash`. When another block already holds the hash,
  // nothing changes and false is returned. `notify` false keeps the listener silent about this
  // entry (the window layout's local pages, which no router should count as a cached prefix).
  bool Register(int32_t block, BlockHash hash, BlockHash parent, absl::Span<const int32_t> tokens,
                uint64_t salt_hash, bool notify = true);
  std::optional<BlockHash> HashOf(int32_t block) const;
  // The prefix-cache identity of a cached block (what Register recorded); nullopt when the block
  // is not cached. The span is valid until the block leaves the cache.
  struct CachedIdentity {
    BlockHash hash = 0;
    BlockHash parent = 0;
    uint64_t salt_hash = 0;
    absl::Span<const int32_t> tokens;
  };
  std::optional<CachedIdentity> Identity(int32_t block) const;
  // Called by Allocate just before it evicts a cached block whose entry the listener sees (its
  // bytes are still intact): the KV tiers copy it out (common/engine/tier_feature.h). Must not
  // call into the pool. Null: none.
  void set_eviction_hook(std::function<void(int32_t block)> hook) {
    eviction_hook_ = std::move(hook);
  }

  // Drops every evictable block from the cache (they become free).
  void ClearCache();
  void set_listener(Listener listener) { listener_ = std::move(listener); }

 private:
  struct CacheEntry {
    BlockHash hash = 0;
    BlockHash parent = 0;
    uint64_t salt = 0;
    std::vector<int32_t> tokens;
    bool notify = true;
  };
  void LruRemove(int32_t block);
  void LruPushBack(int32_t block);
  void Uncache(int32_t block);

  const bool prefix_cache_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;
  std::vector<std::optional<CacheEntry>> entry_;  // per block, when cached
  std::unordered_map<BlockHash, int32_t> by_hash_;
  // Intrusive doubly linked LRU list of evictable blocks; head = least recently used.
  std::vector<int32_t> prev_, next_;
  int32_t head_ = -1, tail_ = -1;
  int64_t num_evictable_ = 0;
  int64_t num_referenced_ = 0;
  int64_t num_evictions_ = 0;
  Listener listener_;
  std::function<void(int32_t)> eviction_hook_;
};

}  // namespace tandem
