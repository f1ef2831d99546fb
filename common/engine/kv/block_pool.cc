#include "common/engine/kv/block_pool.h"

#include "common/base/log.h"

namespace tandem {

BlockPool::BlockPool(int64_t num_blocks, bool enable_prefix_cache)
    : prefix_cache_(enable_prefix_cache),
      refcount_(num_blocks, 0),
      entry_(num_blocks),
      prev_(num_blocks, -1),
      next_(num_blocks, -1) {
  free_.reserve(num_blocks);
  // Hand out low ids first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<int32_t> BlockPool::Allocate() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (head_ >= 0) {
    block = head_;
    LruRemove(block);
    if (eviction_hook_ && entry_[block]->notify) eviction_hook_(block);
    Uncache(block);
    ++num_evictions_;
  } else {
    return std::nullopt;
  }
  TANDEM_CHECK(refcount_[block] == 0) << "block " << block;
  refcount_[block] = 1;
  ++num_referenced_;
  return block;
}

void BlockPool::AddRef(int32_t block) {
  TANDEM_CHECK(refcount_[block] > 0) << "AddRef on unreferenced block " << block;
  ++refcount_[block];
}

void BlockPool::Release(int32_t block) {
  TANDEM_CHECK(refcount_[block] > 0) << "Release of unreferenced block " << block;
  if (--refcount_[block] > 0) return;
  --num_referenced_;
  if (entry_[block].has_value()) {
    LruPushBack(block);
  } else {
    free_.push_back(block);
  }
}

std::optional<int32_t> BlockPool::AcquireCached(BlockHash hash, BlockHash parent,
                                                absl::Span<const int32_t> tokens,
                                                uint64_t salt_hash) {
  if (!prefix_cache_) return std::nullopt;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const int32_t block = it->second;
  const CacheEntry& e = *entry_[block];
  if (e.parent != parent || e.salt != salt_hash || absl::Span<const int32_t>(e.tokens) != tokens) {
    return std::nullopt;  // hash collision: treat as a miss
  }
  if (refcount_[block] == 0) {
    LruRemove(block);
    ++num_referenced_;
  }
  ++refcount_[block];
  return block;
}

bool BlockPool::Register(int32_t block, BlockHash hash, BlockHash parent,
                         absl::Span<const int32_t> tokens, uint64_t salt_hash, bool notify) {
  if (!prefix_cache_) return false;
  TANDEM_CHECK(refcount_[block] > 0) << "Register of unreferenced block " << block;
  if (entry_[block].has_value()) return entry_[block]->hash == hash;
  if (by_hash_.count(hash) != 0) return false;
  entry_[block] = CacheEntry{hash, parent, salt_hash, {tokens.begin(), tokens.end()}, notify};
  by_hash_.emplace(hash, block);
  if (notify && listener_.on_stored) listener_.on_stored(hash);
  return true;
}

std::optional<BlockHash> BlockPool::HashOf(int32_t block) const {
  if (!entry_[block].has_value()) return std::nullopt;
  return entry_[block]->hash;
}

std::optional<BlockPool::CachedIdentity> BlockPool::Identity(int32_t block) const {
  if (!entry_[block].has_value()) return std::nullopt;
  const CacheEntry& e = *entry_[block];
  return CachedIdentity{e.hash, e.parent, e.salt, e.tokens};
}

void BlockPool::ClearCache() {
  while (head_ >= 0) {
    int32_t block = head_;
    LruRemove(block);
    Uncache(block);
    free_.push_back(block);
  }
}

void BlockPool::Uncache(int32_t block) {
  if (!entry_[block].has_value()) return;
  BlockHash hash = entry_[block]->hash;
  const bool notify = entry_[block]->notify;
  by_hash_.erase(hash);
  entry_[block].reset();
  if (notify && listener_.on_removed) listener_.on_removed(hash);
}

void BlockPool::LruRemove(int32_t block) {
  int32_t p = prev_[block], n = next_[block];
  if (p >= 0)
    next_[p] = n;
  else
    head_ = n;
  if (n >= 0)
    prev_[n] = p;
  else
    tail_ = p;
  prev_[block] = next_[block] = -1;
  --num_evictable_;
}

void BlockPool::LruPushBack(int32_t block) {
  prev_[block] = tail_;
  next_[block] = -1;
  if (tail_ >= 0)
    next_[tail_] = block;
  else
    head_ = block;
  tail_ = block;
  ++num_evictable_;
}

}  // namespace tandem
