#include "common/engine/kv/kv_cache_manager.h"

#include <algorithm>

#include "common/base/log.h"

namespace tandem {

BlockHash LocalPageHash(BlockHash block_hash, int64_t group, uint64_t salt_hash) {
  const int32_t tag = static_cast<int32_t>(-1 - group);
  return ComputeBlockHash(block_hash, absl::Span<const int32_t>(&tag, 1), salt_hash);
}

namespace {

// The token span a local page's cache entry records (with the block's hash as its parent).
struct LocalTag {
  explicit LocalTag(int64_t group) : tag(static_cast<int32_t>(-1 - group)) {}
  absl::Span<const int32_t> span() const { return absl::Span<const int32_t>(&tag, 1); }
  int32_t tag;
};

}  // namespace

KvCacheManager::KvCacheManager(BlockPool* pool, int64_t block_size, KvWindow window,
                               MapLocalPage on_map)
    : pool_(pool), block_size_(block_size), window_(window), on_map_(std::move(on_map)) {
  if (window_.window <= 0) window_.num_groups = 0;
  if (groups() > 0) {
    local_holders_.assign(pool_->num_blocks(), 0);
    mapped_.assign(groups() * pool_->num_blocks(), -1);
  }
}

int64_t KvCacheManager::FirstWindowBlock(int64_t position) const {
  return std::max<int64_t>(0, position - window_.window + 1) / block_size_;
}

int64_t KvCacheManager::PagesFor(int64_t num_tokens, int64_t chunk) const {
  const int64_t blocks = BlocksFor(num_tokens);
  if (groups() == 0) return blocks;
  const int64_t local = std::min(blocks, BlocksFor(window_.window - 1 + chunk) + 1);
  return blocks + groups() * local;
}

int64_t KvCacheManager::PagesHeld(const SequenceBlocks& seq) const {
  int64_t pages = LocalBlocks(seq, static_cast<int64_t>(seq.table.size()));
  for (const std::vector<int32_t>& g : seq.local) {
    for (int32_t p : g) pages += p >= 0;
  }
  return pages;
}

void KvCacheManager::MapHolder(const SequenceBlocks& seq, int64_t i) {
  const int32_t block = seq.table[i];
  if (local_holders_[block]++ != 0) return;
  for (int64_t g = 0; g < groups(); ++g) {
    mapped_[g * pool_->num_blocks() + block] = seq.local[g][i];
    if (on_map_) on_map_(block, g + 1, seq.local[g][i]);
  }
}

void KvCacheManager::UnmapHolder(const SequenceBlocks& seq, int64_t i) {
  const int32_t block = seq.table[i];
  TANDEM_CHECK(local_holders_[block] > 0) << "block " << block << " has no local holder";
  if (--local_holders_[block] != 0) return;
  for (int64_t g = 0; g < groups(); ++g) {
    mapped_[g * pool_->num_blocks() + block] = -1;
    if (on_map_) on_map_(block, g + 1, -1);
  }
}

void KvCacheManager::DropLocal(SequenceBlocks* seq, int64_t i) {
  if (!HoldsLocal(*seq, i)) return;
  UnmapHolder(*seq, i);
  for (int64_t g = 0; g < groups(); ++g) {
    pool_->Release(seq->local[g][i]);
    seq->local[g][i] = -1;
  }
}

int64_t KvCacheManager::AcquirePrefix(absl::Span<const int32_t> tokens, SequenceBlocks* seq) {
  TANDEM_CHECK(seq->table.empty()) << "AcquirePrefix on a sequence that holds blocks";
  seq->local.assign(groups(), {});
  seq->trimmed = 0;
  if (!pool_->prefix_cache_enabled() || tokens.empty()) return 0;
  // Never a cached block where a zero-copy destination's blocks go.
  const int64_t max_blocks =
      LocalBlocks(*seq, (static_cast<int64_t>(tokens.size()) - 1) / block_size_);
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
  if (groups() > 0) {
    // The longest prefix whose window before it (what the next query sees) still has its local
    // pages cached, and the same pages as other holders of those blocks hold.
    const int64_t n = static_cast<int64_t>(seq->table.size());
    auto usable = [&](int64_t m) {
      for (int64_t i = FirstWindowBlock(m * block_size_); i < m; ++i) {
        for (int64_t g = 0; g < groups(); ++g) {
          auto page = pool_->CachedBlock(LocalPageHash(seq->hashes[i], g, seq->salt_hash));
          if (!page.has_value()) return false;
          if (local_holders_[seq->table[i]] > 0 && MappedPage(seq->table[i], g) != *page) {
            return false;
          }
        }
      }
      return true;
    };
    int64_t m = n;
    while (m > 0 && !usable(m)) --m;
    while (static_cast<int64_t>(seq->table.size()) > m) {
      pool_->Release(seq->table.back());
      seq->table.pop_back();
      seq->hashes.pop_back();
    }
    const int64_t first = m > 0 ? FirstWindowBlock(m * block_size_) : 0;
    for (int64_t g = 0; g < groups(); ++g) seq->local[g].assign(m, -1);
    std::vector<int32_t> pages;
    for (int64_t i = first; i < m; ++i) {
      pages.clear();
      for (int64_t g = 0; g < groups(); ++g) {
        const LocalTag tag(g);
        auto page = pool_->AcquireCached(LocalPageHash(seq->hashes[i], g, seq->salt_hash),
                                         seq->hashes[i], tag.span(), seq->salt_hash);
        if (!page.has_value()) break;
        pages.push_back(*page);
      }
      if (static_cast<int64_t>(pages.size()) < groups()) {  // a hash collision: give it all up
        for (int32_t p : pages) pool_->Release(p);
        Free(seq);
        return 0;
      }
      for (int64_t g = 0; g < groups(); ++g) seq->local[g][i] = pages[g];
      MapHolder(*seq, i);
    }
    seq->trimmed = first;
  }
  seq->registered = static_cast<int64_t>(seq->table.size());
  return seq->registered * block_size_;
}

int64_t KvCacheManager::ProbePrefix(absl::Span<const int32_t> tokens, uint64_t salt_hash) const {
  if (!pool_->prefix_cache_enabled() || tokens.empty()) return 0;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  BlockHash parent = kNoParentHash;
  std::vector<BlockHash> hashes;
  for (int64_t i = 0; i < max_blocks; ++i) {
    parent = ComputeBlockHash(parent, tokens.subspan(i * block_size_, block_size_), salt_hash);
    if (!pool_->IsCached(parent)) break;
    hashes.push_back(parent);
  }
  int64_t m = static_cast<int64_t>(hashes.size());
  if (groups() == 0) return m * block_size_;
  auto usable = [&](int64_t m) {
    for (int64_t i = FirstWindowBlock(m * block_size_); i < m; ++i) {
      for (int64_t g = 0; g < groups(); ++g) {
        if (!pool_->IsCached(LocalPageHash(hashes[i], g, salt_hash))) return false;
      }
    }
    return true;
  };
  while (m > 0 && !usable(m)) --m;
  return m * block_size_;
}

int64_t KvCacheManager::WindowFirstBlock(int64_t num_computed) const {
  if (groups() == 0) return 0;
  return FirstWindowBlock(std::max<int64_t>(0, num_computed - 1));
}

int64_t KvCacheManager::BlocksNeeded(const SequenceBlocks& seq, int64_t num_tokens,
                                     int64_t local_from) const {
  const int64_t held = static_cast<int64_t>(seq.table.size());
  // A zero-copy destination's blocks come from it, not the pool.
  const int64_t blocks = std::max<int64_t>(0, LocalBlocks(seq, BlocksFor(num_tokens)) - held);
  const int64_t local = std::max<int64_t>(0, BlocksFor(num_tokens) - std::max(held, local_from));
  return blocks + groups() * local;
}

bool KvCacheManager::Grow(SequenceBlocks* seq, int64_t num_tokens, int64_t local_from) {
  const int64_t needed = BlocksNeeded(*seq, num_tokens, local_from);
  // Covered already (not "needed == 0": a zero-copy destination's blocks need no pool blocks).
  if (static_cast<int64_t>(seq->table.size()) >= BlocksFor(num_tokens)) return true;
  if (needed > pool_->num_available()) return false;
  if (static_cast<int64_t>(seq->local.size()) != groups()) {
    seq->local.assign(groups(), std::vector<int32_t>(seq->table.size(), -1));
  }
  auto allocate = [&] {
    auto block = pool_->Allocate();
    TANDEM_CHECK(block.has_value()) << "pool reported available blocks but allocation failed";
    return *block;
  };
  for (int64_t i = static_cast<int64_t>(seq->table.size()); i < BlocksFor(num_tokens); ++i) {
    if (seq->IsRemote(i)) {
      TANDEM_CHECK(groups() == 0) << "a zero-copy destination in the window layout";
      TANDEM_CHECK(i - seq->remote_from < static_cast<int64_t>(seq->remote.size()))
          << "sequence grows past its zero-copy destination";
      seq->table.push_back(seq->remote[i - seq->remote_from]);
      continue;
    }
    seq->table.push_back(allocate());
    const bool local = i >= local_from;  // before it: outside the window, never held
    for (int64_t g = 0; g < groups(); ++g) seq->local[g].push_back(local ? allocate() : -1);
    if (groups() > 0 && local) MapHolder(*seq, i);
  }
  return true;
}

int64_t KvCacheManager::CopiesNeeded(const SequenceBlocks& seq, int64_t begin, int64_t end) const {
  if (end <= begin) return 0;
  const int64_t first = begin / block_size_;
  const int64_t last =
      std::min<int64_t>((end - 1) / block_size_, static_cast<int64_t>(seq.table.size()) - 1);
  int64_t shared = 0;
  for (int64_t i = first; i <= std::min(last, LocalBlocks(seq, last + 1) - 1); ++i) {
    shared += pool_->refcount(seq.table[i]) > 1;
    if (!HoldsLocal(seq, i)) continue;
    for (int64_t g = 0; g < groups(); ++g) shared += pool_->refcount(seq.local[g][i]) > 1;
  }
  return shared;
}

bool KvCacheManager::MakeWritable(SequenceBlocks* seq, int64_t begin, int64_t end,
                                  std::vector<std::pair<int32_t, int32_t>>* copies) {
  if (end <= begin) return true;
  if (CopiesNeeded(*seq, begin, end) > pool_->num_available()) return false;
  const int64_t first = begin / block_size_;
  int64_t last =
      std::min<int64_t>((end - 1) / block_size_, static_cast<int64_t>(seq->table.size()) - 1);
  last = std::min(last, LocalBlocks(*seq, last + 1) - 1);  // a destination's blocks are its own
  auto make_private = [&](int32_t* page) {
    if (pool_->refcount(*page) <= 1) return false;
    const int32_t fresh = *pool_->Allocate();
    copies->emplace_back(*page, fresh);
    pool_->Release(*page);
    *page = fresh;
    return true;
  };
  for (int64_t i = first; i <= last; ++i) {
    const bool local = HoldsLocal(*seq, i);
    if (local) UnmapHolder(*seq, i);
    if (make_private(&seq->table[i]) && i < seq->registered) {
      seq->registered = i;  // the copy is not (yet) a cache entry
    }
    if (local) {
      for (int64_t g = 0; g < groups(); ++g) make_private(&seq->local[g][i]);
      MapHolder(*seq, i);
    }
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
  // A zero-copy destination's blocks are the receiver's: never cached here.
  for (int64_t i = seq->registered; i < LocalBlocks(*seq, full); ++i) {
    BlockHash parent = i == 0 ? kNoParentHash : seq->hashes[i - 1];
    const bool ours = pool_->Register(seq->table[i], seq->hashes[i], parent,
                                      tokens.subspan(i * block_size_, block_size_), seq->salt_hash);
    // Local pages are cached only with the block they belong to, so that every holder of a
    // cached block finds the same pages.
    if (!ours || !HoldsLocal(*seq, i)) continue;
    for (int64_t g = 0; g < groups(); ++g) {
      const LocalTag tag(g);
      pool_->Register(seq->local[g][i], LocalPageHash(seq->hashes[i], g, seq->salt_hash),
                      seq->hashes[i], tag.span(), seq->salt_hash, /*notify=*/false);
    }
  }
  seq->registered = std::max(seq->registered, full);
}

void KvCacheManager::TrimWindow(SequenceBlocks* seq, int64_t num_computed) {
  if (groups() == 0) return;
  // One position of margin below the next query's window. No row of a step needs it (the
  // next query is at num_computed), but it sets the window a decode worker reserves and a
  // prefill worker checks (WindowFirstBlock, prefill_core.cc): narrowing it changes that
  // protocol boundary, so it stays until the protocol changes with it.
  const int64_t limit = std::min<int64_t>(FirstWindowBlock(std::max<int64_t>(0, num_computed - 1)),
                                          static_cast<int64_t>(seq->table.size()));
  for (int64_t i = seq->trimmed; i < limit; ++i) DropLocal(seq, i);
  seq->trimmed = std::max(seq->trimmed, limit);
}

void KvCacheManager::Fork(const SequenceBlocks& parent, SequenceBlocks* child) {
  TANDEM_CHECK(child->table.empty()) << "Fork into a sequence that holds blocks";
  *child = parent;
  for (int64_t i = 0; i < LocalBlocks(*child, static_cast<int64_t>(child->table.size())); ++i) {
    pool_->AddRef(child->table[i]);
  }
  for (int64_t i = 0; i < static_cast<int64_t>(child->table.size()); ++i) {
    if (!HoldsLocal(*child, i)) continue;
    for (int64_t g = 0; g < groups(); ++g) pool_->AddRef(child->local[g][i]);
    MapHolder(*child, i);
  }
}

void KvCacheManager::Truncate(SequenceBlocks* seq, int64_t num_tokens) {
  const int64_t keep = BlocksFor(num_tokens);
  while (static_cast<int64_t>(seq->table.size()) > keep) {
    const int64_t i = static_cast<int64_t>(seq->table.size()) - 1;
    DropLocal(seq, i);
    for (std::vector<int32_t>& g : seq->local) g.pop_back();
    if (!seq->IsRemote(i)) pool_->Release(seq->table.back());
    seq->table.pop_back();
  }
  const int64_t full = num_tokens / block_size_;
  if (static_cast<int64_t>(seq->hashes.size()) > full) seq->hashes.resize(full);
  seq->registered = std::min(seq->registered, full);
  seq->trimmed = std::min(seq->trimmed, keep);
}

void KvCacheManager::Free(SequenceBlocks* seq) {
  // Release in reverse so that a sequence's tail blocks are evicted before its prefix.
  for (int64_t i = static_cast<int64_t>(seq->table.size()) - 1; i >= 0; --i) {
    DropLocal(seq, i);
    if (!seq->IsRemote(i)) pool_->Release(seq->table[i]);
  }
  seq->table.clear();
  seq->local.clear();
  seq->hashes.clear();
  seq->registered = 0;
  seq->trimmed = 0;
}

}  // namespace tandem
