#include "common/engine/kv/kv_cache_manager.h"

#include <algorithm>

#include "common/base/log.h"

namespace tandem {

int64_t KvCacheManager::AcquirePrefix(absl::Span<const int32_t> tokens, SequenceBlocks* seq) {
  TANDEM_CHECK(seq->table.empty()) << "AcquirePrefix on a sequence that holds blocks";
  if (!pool_->prefix_cache_enabled() || tokens.empty()) return 0;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  BlockHash parent = kNoParentHash;
  for (int64_t i = 0; i < max_blocks; ++i) {
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    BlockHash h = ComputeBlockHash(parent, block_tokens, seq->salt_hash);
    auto block = pool_->AcquireCached(h, parent, block_tokens, seq->salt_hash);
    if (!block.has_value()) break;
    seq->table.push_back(*block);
    seq->hashes.push_back(h);
    parent = h;
  }
  seq->registered = static_cast<int64_t>(seq->table.size());
  return seq->registered * block_size_;
}

int64_t KvCacheManager::ProbePrefix(absl::Span<const int32_t> tokens, uint64_t salt_hash) const {
  if (!pool_->prefix_cache_enabled() || tokens.empty()) return 0;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  BlockHash parent = kNoParentHash;
  int64_t i = 0;
  for (; i < max_blocks; ++i) {
    parent = ComputeBlockHash(parent, tokens.subspan(i * block_size_, block_size_), salt_hash);
    if (!pool_->IsCached(parent)) break;
  }
  return i * block_size_;
}

int64_t KvCacheManager::BlocksNeeded(const SequenceBlocks& seq, int64_t num_tokens) const {
  return std::max<int64_t>(0, BlocksFor(num_tokens) - static_cast<int64_t>(seq.table.size()));
}

bool KvCacheManager::Grow(SequenceBlocks* seq, int64_t num_tokens) {
  const int64_t needed = BlocksNeeded(*seq, num_tokens);
  if (needed == 0) return true;
  if (needed > pool_->num_available()) return false;
  for (int64_t i = 0; i < needed; ++i) {
    auto block = pool_->Allocate();
    TANDEM_CHECK(block.has_value()) << "pool reported available blocks but allocation failed";
    seq->table.push_back(*block);
  }
  return true;
}

bool KvCacheManager::MakeWritable(SequenceBlocks* seq, int64_t begin, int64_t end,
                                  std::vector<std::pair<int32_t, int32_t>>* copies) {
  if (end <= begin) return true;
  const int64_t first = begin / block_size_;
  const int64_t last =
      std::min<int64_t>((end - 1) / block_size_, static_cast<int64_t>(seq->table.size()) - 1);
  int64_t shared = 0;
  for (int64_t i = first; i <= last; ++i) shared += pool_->refcount(seq->table[i]) > 1;
  if (shared > pool_->num_available()) return false;
  for (int64_t i = first; i <= last; ++i) {
    const int32_t old_block = seq->table[i];
    if (pool_->refcount(old_block) <= 1) continue;
    const int32_t fresh = *pool_->Allocate();
    copies->emplace_back(old_block, fresh);
    pool_->Release(old_block);
    seq->table[i] = fresh;
    if (i < seq->registered) seq->registered = i;  // the copy is not (yet) a cache entry
  }
  return true;
}

void KvCacheManager::RegisterFull(absl::Span<const int32_t> tokens, int64_t num_computed,
                                  SequenceBlocks* seq) {
  const int64_t full =
      std::min<int64_t>(num_computed / block_size_, static_cast<int64_t>(seq->table.size()));
  if (seq->hashes.size() > static_cast<size_t>(full)) seq->hashes.resize(full);
  for (int64_t i = static_cast<int64_t>(seq->hashes.size()); i < full; ++i) {
    BlockHash parent = i == 0 ? kNoParentHash : seq->hashes[i - 1];
    seq->hashes.push_back(
        ComputeBlockHash(parent, tokens.subspan(i * block_size_, block_size_), seq->salt_hash));
  }
  if (!pool_->prefix_cache_enabled()) {
    seq->registered = full;
    return;
  }
  for (int64_t i = seq->registered; i < full; ++i) {
    BlockHash parent = i == 0 ? kNoParentHash : seq->hashes[i - 1];
    pool_->Register(seq->table[i], seq->hashes[i], parent,
                    tokens.subspan(i * block_size_, block_size_), seq->salt_hash);
  }
  seq->registered = std::max(seq->registered, full);
}

void KvCacheManager::Fork(const SequenceBlocks& parent, SequenceBlocks* child) {
  TANDEM_CHECK(child->table.empty()) << "Fork into a sequence that holds blocks";
  *child = parent;
  for (int32_t block : child->table) pool_->AddRef(block);
}

void KvCacheManager::Truncate(SequenceBlocks* seq, int64_t num_tokens) {
  const int64_t keep = BlocksFor(num_tokens);
  while (static_cast<int64_t>(seq->table.size()) > keep) {
    pool_->Release(seq->table.back());
    seq->table.pop_back();
  }
  const int64_t full = num_tokens / block_size_;
  if (static_cast<int64_t>(seq->hashes.size()) > full) seq->hashes.resize(full);
  seq->registered = std::min(seq->registered, full);
}

void KvCacheManager::Free(SequenceBlocks* seq) {
  // Release in reverse so that a sequence's tail blocks are evicted before its prefix.
  for (auto it = seq->table.rbegin(); it != seq->table.rend(); ++it) pool_->Release(*it);
  seq->table.clear();
  seq->hashes.clear();
  seq->registered = 0;
}

}  // namespace tandem
