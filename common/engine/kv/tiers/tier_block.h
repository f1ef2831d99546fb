#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cluster/block_hash.h"

namespace tandem {

// One full KV block as the tiers below the pool keep it: its prefix-cache identity (hash, parent
// hash, cache salt, token ids: what BlockPool::Register records, so that a block loaded back is
// matched exactly as a pool hit is) and its bytes (every layer region of the block, layer order,
// KvCacheSpec::bytes_per_block()). Immutable once made: the tiers share it by pointer.
struct TierBlock {
  BlockHash hash = 0;
  BlockHash parent = 0;
  uint64_t salt = 0;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> payload;

  // Bytes a tier counts for it (payload and identity).
  int64_t size_bytes() const {
    return static_cast<int64_t>(payload.size() + tokens.size() * sizeof(int32_t)) + 64;
  }
};
using TierBlockPtr = std::shared_ptr<const TierBlock>;

// 64-bit checksum of `bytes` (word at a time; detects flipped and torn bytes, not an adversary).
uint64_t TierChecksum(absl::Span<const uint8_t> bytes, uint64_t seed = 0);

// The file form of a block (disk tier): a 64-byte header (magic, format version, the store's
// fingerprint, hash, parent, salt, token count, payload size, checksum of everything else),
// then the tokens, then the payload. Little-endian.
std::vector<uint8_t> EncodeTierBlock(const TierBlock& block, uint64_t fingerprint);

// Parses and checks a file's bytes: DATA_LOSS when the magic, version, fingerprint, sizes,
// checksum or the hash chain (hash == ComputeBlockHash(parent, tokens, salt)) do not hold, or the
// hash is not `expected_hash`. A block that passes is byte for byte what was encoded.
absl::StatusOr<TierBlock> DecodeTierBlock(absl::Span<const uint8_t> bytes, uint64_t fingerprint,
                                          BlockHash expected_hash);

}  // namespace tandem
