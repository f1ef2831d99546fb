#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "common/base/block_hash.h"
#include "common/engine/kv/block_pool.h"

namespace tandem {

// The KV blocks one sequence holds: its block table (block i covers positions
// [i*block_size, (i+1)*block_size)) and the hash chain of its full blocks.
struct SequenceBlocks {
  std::vector<int32_t> table;
  std::vector<BlockHash> hashes;  // hashes[i] for full block i, once known
  uint64_t salt_hash = 0;
  int64_t registered = 0;  // leading full blocks registered in (or taken from) the prefix cache
};

// Per-sequence block operations on top of BlockPool: prefix-cache lookup at admission,
// allocation as a sequence grows, copy-on-write for shared blocks, registration of blocks that
// became full, and release. Engine thread only.
class KvCacheManager {
 public:
  KvCacheManager(BlockPool* pool, int64_t block_size) : pool_(pool), block_size_(block_size) {}

  int64_t block_size() const { return block_size_; }
  BlockPool* pool() { return pool_; }
  int64_t BlocksFor(int64_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // Takes the longest cached prefix of `tokens` (only blocks entirely within the first
  // tokens.size() - 1 tokens, so at least one token is left to compute for logits). Returns
  // the number of tokens whose KV is now in `seq` (a multiple of block_size).
  int64_t AcquirePrefix(absl::Span<const int32_t> tokens, SequenceBlocks* seq);

  // Number of tokens AcquirePrefix would find cached, without taking anything.
  int64_t ProbePrefix(absl::Span<const int32_t> tokens, uint64_t salt_hash) const;

  // Grows `seq` to cover `num_tokens` positions. All-or-nothing: false (and no change) when the
  // pool lacks blocks.
  bool Grow(SequenceBlocks* seq, int64_t num_tokens);
  // Blocks Grow would need to take from the pool.
  int64_t BlocksNeeded(const SequenceBlocks& seq, int64_t num_tokens) const;

  // Before writing positions [begin, end): every block in that range referenced by other
  // sequences is replaced by a private copy. Returns (src, dst) pairs the backend must copy,
  // or false when the pool lacks blocks (nothing changed).
  bool MakeWritable(SequenceBlocks* seq, int64_t begin, int64_t end,
                    std::vector<std::pair<int32_t, int32_t>>* copies);

  // Registers the full blocks of `tokens[0, num_computed)` not yet registered.
  void RegisterFull(absl::Span<const int32_t> tokens, int64_t num_computed, SequenceBlocks* seq);

  // Shares every block of `parent` with `child` (reference counts, not copies).
  void Fork(const SequenceBlocks& parent, SequenceBlocks* child);

  // Drops blocks beyond those covering `num_tokens` positions (speculative rollback).
  void Truncate(SequenceBlocks* seq, int64_t num_tokens);

  // Releases every block of `seq` and clears it. Registered blocks stay in the prefix cache.
  void Free(SequenceBlocks* seq);

 private:
  BlockPool* pool_;
  int64_t block_size_;
};

}  // namespace tandem
