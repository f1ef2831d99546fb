#include "common/engine/kv/tiers/tier_block.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

constexpr uint32_t kMagic = 0x42564b54;  // "TKVB"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 64;

// Header fields at fixed offsets.
struct Header {
  uint32_t magic;
  uint32_t version;
  uint64_t fingerprint;
  uint64_t hash;
  uint64_t parent;
  uint64_t salt;
  uint32_t num_tokens;
  uint32_t reserved;
  uint64_t payload_bytes;
  uint64_t checksum;
};
static_assert(sizeof(Header) == kHeaderBytes, "header layout");

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t Fmix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

uint64_t ChecksumOf(const Header& header, absl::Span<const uint8_t> rest) {
  Header h = header;
  h.checksum = 0;
  const uint64_t head =
      TierChecksum(absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(&h), sizeof(h)));
  return TierChecksum(rest, head);
}

}  // namespace

uint64_t TierChecksum(absl::Span<const uint8_t> bytes, uint64_t seed) {
  // Four independent lanes of multiply-rotate over 8-byte words, folded at the end.
  constexpr uint64_t k1 = 0x9e3779b185ebca87ull, k2 = 0xc2b2ae3d27d4eb4full;
  uint64_t lane[4] = {seed + k1 + k2, seed + k2, seed, seed - k1};
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  while (n >= 32) {
    for (int i = 0; i < 4; ++i) {
      uint64_t w;
      std::memcpy(&w, p + 8 * i, 8);
      lane[i] = Rotl(lane[i] + w * k2, 31) * k1;
    }
    p += 32;
    n -= 32;
  }
  uint64_t h = Rotl(lane[0], 1) + Rotl(lane[1], 7) + Rotl(lane[2], 12) + Rotl(lane[3], 18);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = Rotl(h ^ (Rotl(w * k2, 31) * k1), 27) * k1 + k2;
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    h = Rotl(h ^ (static_cast<uint64_t>(*p) * k1), 11) * k2;
    ++p;
    --n;
  }
  return Fmix(h ^ bytes.size());
}

std::vector<uint8_t> EncodeTierBlock(const TierBlock& block, uint64_t fingerprint) {
  const size_t token_bytes = block.tokens.size() * sizeof(int32_t);
  std::vector<uint8_t> out(kHeaderBytes + token_bytes + block.payload.size());
  if (token_bytes > 0) std::memcpy(out.data() + kHeaderBytes, block.tokens.data(), token_bytes);
  if (!block.payload.empty()) {
    std::memcpy(out.data() + kHeaderBytes + token_bytes, block.payload.data(),
                block.payload.size());
  }
  Header h{kMagic,
           kVersion,
           fingerprint,
           block.hash,
           block.parent,
           block.salt,
           static_cast<uint32_t>(block.tokens.size()),
           0,
           block.payload.size(),
           0};
  h.checksum = ChecksumOf(h, absl::Span<const uint8_t>(out).subspan(kHeaderBytes));
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

absl::StatusOr<TierBlock> DecodeTierBlock(absl::Span<const uint8_t> bytes, uint64_t fingerprint,
                                          BlockHash expected_hash,
                                          const TierPayloadSource& payload_memory) {
  if (bytes.size() < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat("block file of ", bytes.size(), " bytes is torn"));
  }
  Header h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kMagic || h.version != kVersion) {
    return absl::DataLossError("not a KV block file of this version");
  }
  if (h.fingerprint != fingerprint) {
    return absl::DataLossError("block file of another model, dtype or layout");
  }
  if (h.hash != expected_hash) return absl::DataLossError("block file holds another block");
  const uint64_t token_bytes = uint64_t{h.num_tokens} * sizeof(int32_t);
  if (bytes.size() != kHeaderBytes + token_bytes + h.payload_bytes) {
    return absl::DataLossError(absl::StrCat("block file of ", bytes.size(), " bytes, header says ",
                                            kHeaderBytes + token_bytes + h.payload_bytes));
  }
  const auto rest = bytes.subspan(kHeaderBytes);
  if (ChecksumOf(h, rest) != h.checksum) return absl::DataLossError("block checksum mismatch");
  TierBlock b;
  b.hash = h.hash;
  b.parent = h.parent;
  b.salt = h.salt;
  b.tokens.resize(h.num_tokens);
  if (token_bytes > 0) std::memcpy(b.tokens.data(), rest.data(), token_bytes);
  if (ComputeBlockHash(b.parent, b.tokens, b.salt) != b.hash) {
    return absl::DataLossError("block identity does not hash to its name");
  }
  const size_t payload_bytes = h.payload_bytes;
  if (payload_memory) b.payload = payload_memory(payload_bytes);
  if (b.payload.size() != payload_bytes) b.payload = TierPayload(payload_bytes);
  if (payload_bytes > 0) std::memcpy(b.payload.data(), rest.data() + token_bytes, payload_bytes);
  return b;
}

}  // namespace tandem
