#pragma once

#include <cstdint>
#include <string_view>

#include "absl/types/span.h"

namespace tandem {

// Identity of a full KV block in the prefix cache: a hash chain over (parent block's hash,
// the block's token ids, the request's cache salt). Stable across processes and machines (the
// router and workers exchange these values), so it is computed with a fixed function, never
// std::hash.
using BlockHash = uint64_t;

constexpr BlockHash kNoParentHash = 0x6a09e667f3bcc908ull;

// 64-bit hash of a salt string (empty salt -> a fixed value).
uint64_t HashSalt(std::string_view salt);

// The salt of a request run with a LoRA adapter: its cache salt's hash combined with the
// adapter's cache key (LoraAdapter::cache_key; 0: the base model, whose salt is unchanged), so
// KV computed under one adapter is never a prefix-cache hit for another or for the base model.
uint64_t SaltWithAdapter(uint64_t salt_hash, uint64_t adapter_key);

BlockHash ComputeBlockHash(BlockHash parent, absl::Span<const int32_t> tokens, uint64_t salt_hash);

// Hashes of the full blocks of `tokens` (tokens.size() / block_size of them), chained.
void ComputeBlockHashes(absl::Span<const int32_t> tokens, int64_t block_size, uint64_t salt_hash,
                        BlockHash* out);

}  // namespace tandem
