#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "common/base/kv_layout.h"
#include "common/cluster/block_hash.h"
#include "common/engine/kv/block_pool.h"

namespace tandem {

// The KV blocks one sequence holds: its block table (block i covers positions
// [i*block_size, (i+1)*block_size)) and the hash chain of its full blocks.
struct SequenceBlocks {
  std::vector<int32_t> table;
  // Window layout only (KvWindow::num_groups > 0): per local group, the page holding that
  // group's layers for table[i], or -1 once block i is outside the window (released).
  std::vector<std::vector<int32_t>> local;
  std::vector<BlockHash> hashes;  // hashes[i] for full block i, once known
  uint64_t salt_hash = 0;
  int64_t registered = 0;  // leading full blocks registered in (or taken from) the prefix cache
  int64_t trimmed = 0;     // leading blocks whose local pages were released (window layout)
  // A zero-copy destination (a prefill worker writing a prompt's KV straight into a decode
  // worker's reserved blocks, kvtransfer/README.md "Zero-copy on one GPU"): table entries from
  // `remote_from` on are remote[i - remote_from], ids tagged kKvRemoteBlock (kv_layout.h) that
  // the pool never sees: Grow takes them instead of allocating, the prefix cache neither gives
  // (AcquirePrefix stops before remote_from) nor registers them, and Free, Truncate, Fork and
  // copy-on-write leave them alone. They describe the sequence, not what it holds: Free keeps
  // them, so a preempted sequence recomputes into the same destination. Empty: none.
  std::vector<int32_t> remote;
  int64_t remote_from = 0;

  bool IsRemote(int64_t i) const { return !remote.empty() && i >= remote_from; }
};

// The window layout of the pool (KvCacheSpec::windowed): `num_groups` local layer groups whose
// pages are held only for the blocks inside the last `window` positions. num_groups 0: none.
struct KvWindow {
  int64_t window = 0;
  int64_t num_groups = 0;
};

// Per-sequence block operations on top of BlockPool: prefix-cache lookup at admission,
// allocation as a sequence grows, copy-on-write for shared blocks, registration of blocks that
// became full, and release. Engine thread only.
//
// Window layout: every pool id is a page. A block of a sequence is one page for the global
// layers (its table entry) plus, while some query of the sequence can still see it, one page per
// local group. Every count below (BlocksNeeded, the pool's free and used numbers) is in pages.
// Local pages come with a new block (Grow), are copied with it (MakeWritable), shared with it
// (Fork) and released when the window passed the block (TrimWindow) or the block is released.
// With prefix caching a full block's local pages are registered too (under a hash derived from
// the block's, silently for the listener), so after release they stay evictable like the block.
// All holders of a block hold the same local pages; `on_map` tells the backend which (for the KV
// transport's (layer, block) regions) when the first holder takes them and -1 when the last drops
// them.
class KvCacheManager {
 public:
  using MapLocalPage = std::function<void(int32_t block, int64_t group, int32_t page)>;

  KvCacheManager(BlockPool* pool, int64_t block_size, KvWindow window = {},
                 MapLocalPage on_map = nullptr);

  int64_t block_size() const { return block_size_; }
  const KvWindow& window() const { return window_; }
  BlockPool* pool() { return pool_; }
  int64_t BlocksFor(int64_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }
  // Pages one sequence of `num_tokens` positions needs at most, prefilled in chunks of up to
  // `chunk` tokens (window layout: the local pages of the blocks a chunk and its window touch).
  int64_t PagesFor(int64_t num_tokens, int64_t chunk) const;
  // Pages `seq` holds (its blocks and their local pages).
  int64_t PagesHeld(const SequenceBlocks& seq) const;

  // Takes the longest cached prefix of `tokens` (only blocks entirely within the first
  // tokens.size() - 1 tokens, so at least one token is left to compute for logits). Window
  // layout: only a prefix whose last window's local pages are cached too (the policy is in the
  // README). Returns the number of tokens whose KV is now in `seq` (a multiple of block_size).
  int64_t AcquirePrefix(absl::Span<const int32_t> tokens, SequenceBlocks* seq);

  // Number of tokens AcquirePrefix would find cached, without taking anything.
  int64_t ProbePrefix(absl::Span<const int32_t> tokens, uint64_t salt_hash) const;

  // Grows `seq` to cover `num_tokens` positions (window layout: each new block with its local
  // pages, except blocks before `local_from`, which get none: a remote prefill's reservation
  // passes WindowFirstBlock(num_tokens), so only the window the next query sees is reserved).
  // All-or-nothing: false (and no change) when the pool lacks pages.
  bool Grow(SequenceBlocks* seq, int64_t num_tokens, int64_t local_from = 0);
  // Pages Grow would need to take from the pool.
  int64_t BlocksNeeded(const SequenceBlocks& seq, int64_t num_tokens, int64_t local_from = 0) const;
  // Window layout: the first block whose local pages TrimWindow(seq, num_computed) keeps (the
  // blocks a query at position num_computed can see, with its one position of margin); 0
  // without a window layout.
  int64_t WindowFirstBlock(int64_t num_computed) const;
  // Pages MakeWritable(seq, begin, end) would copy: those in the range shared with others.
  int64_t CopiesNeeded(const SequenceBlocks& seq, int64_t begin, int64_t end) const;

  // Before writing positions [begin, end): every page in that range referenced by other
  // sequences is replaced by a private copy. Returns (src, dst) pairs the backend must copy,
  // or false when the pool lacks pages (nothing changed).
  bool MakeWritable(SequenceBlocks* seq, int64_t begin, int64_t end,
                    std::vector<std::pair<int32_t, int32_t>>* copies);

  // Registers the full blocks of `tokens[0, num_computed)` not yet registered.
  void RegisterFull(absl::Span<const int32_t> tokens, int64_t num_computed, SequenceBlocks* seq);

  // Window layout: releases the local pages of the blocks no query at position >=
  // num_computed - 1 can see (every position of the block before num_computed - window). No-op
  // without it.
  void TrimWindow(SequenceBlocks* seq, int64_t num_computed);

  // Shares every page of `parent` with `child` (reference counts, not copies).
  void Fork(const SequenceBlocks& parent, SequenceBlocks* child);

  // Drops blocks beyond those covering `num_tokens` positions (speculative rollback).
  void Truncate(SequenceBlocks* seq, int64_t num_tokens);

  // Releases every page of `seq` and clears it. Registered pages stay in the prefix cache.
  void Free(SequenceBlocks* seq);

 private:
  int64_t groups() const { return window_.num_groups; }
  // Of the first `n` table entries of `seq`, those that are the pool's (before its zero-copy
  // destination's).
  static int64_t LocalBlocks(const SequenceBlocks& seq, int64_t n) {
    return seq.remote.empty() ? n : std::min(n, seq.remote_from);
  }
  bool HoldsLocal(const SequenceBlocks& seq, int64_t i) const {
    return groups() > 0 && !seq.local.empty() && seq.local[0][i] >= 0;
  }
  // The holder count of table[i]'s local pages goes up / down (mapping them at the first holder,
  // unmapping at the last).
  void MapHolder(const SequenceBlocks& seq, int64_t i);
  void UnmapHolder(const SequenceBlocks& seq, int64_t i);
  // Releases block i's local pages (if held) and marks them -1.
  void DropLocal(SequenceBlocks* seq, int64_t i);
  // The first block whose local pages a query at `position` still needs.
  int64_t FirstWindowBlock(int64_t position) const;
  int32_t MappedPage(int32_t block, int64_t group) const {
    return mapped_[group * pool_->num_blocks() + block];
  }

  BlockPool* pool_;
  int64_t block_size_;
  KvWindow window_;
  MapLocalPage on_map_;
  std::vector<int32_t> local_holders_;  // per block id: sequences holding its local pages
  std::vector<int32_t> mapped_;         // [group][block id]: the local pages its holders hold
};

// The hash a block's local page of `group` is cached under: derived from the block's own hash.
BlockHash LocalPageHash(BlockHash block_hash, int64_t group, uint64_t salt_hash);

}  // namespace tandem
