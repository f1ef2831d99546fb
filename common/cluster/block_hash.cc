#include "common/cluster/block_hash.h"

namespace tandem {
namespace {

inline uint64_t Mix(uint64_t h, uint64_t v) {
  // A 64-bit multiply-xorshift mixer (wyhash/murmur style finalisation per word).
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

uint64_t HashSalt(std::string_view salt) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then mixed
  for (unsigned char ch : salt) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return Mix(h, salt.size());
}

uint64_t SaltWithAdapter(uint64_t salt_hash, uint64_t adapter_key) {
  return adapter_key == 0 ? salt_hash : Mix(Mix(salt_hash, 0x4c6f5241ull), adapter_key);
}

BlockHash ComputeBlockHash(BlockHash parent, absl::Span<const int32_t> tokens, uint64_t salt_hash) {
  uint64_t h = Mix(parent, salt_hash);
  for (int32_t t : tokens) h = Mix(h, static_cast<uint32_t>(t));
  h = Mix(h, tokens.size());
  return h == 0 ? 1 : h;
}

void ComputeBlockHashes(absl::Span<const int32_t> tokens, int64_t block_size, uint64_t salt_hash,
                        BlockHash* out) {
  BlockHash parent = kNoParentHash;
  const size_t full = tokens.size() / block_size;
  for (size_t i = 0; i < full; ++i) {
    parent = ComputeBlockHash(parent, tokens.subspan(i * block_size, block_size), salt_hash);
    out[i] = parent;
  }
}

}  // namespace tandem
