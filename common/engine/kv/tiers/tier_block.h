#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cluster/block_hash.h"

namespace tandem {

// A block's bytes: heap memory, or a slot of the host tier's memory (HostArena: page-locked on a
// GPU worker, where the device copies DMA straight into and out of it), given back when this is
// gone. Move-only.
class TierPayload {
 public:
  TierPayload() = default;
  // `bytes` of heap memory, not initialized.
  explicit TierPayload(size_t bytes)
      : heap_(std::make_unique_for_overwrite<uint8_t[]>(bytes)), data_(heap_.get()), size_(bytes) {}
  // `size` bytes at `data`, owned by `owner` (a host tier slot's lease).
  TierPayload(uint8_t* data, size_t size, std::shared_ptr<void> owner)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  TierPayload(TierPayload&& o) noexcept { *this = std::move(o); }
  TierPayload& operator=(TierPayload&& o) noexcept {
    heap_ = std::move(o.heap_);
    owner_ = std::move(o.owner_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // In a host tier slot (not heap memory).
  bool in_arena() const { return owner_ != nullptr; }
  uint8_t& operator[](size_t i) { return data_[i]; }
  uint8_t operator[](size_t i) const { return data_[i]; }
  absl::Span<const uint8_t> span() const { return {data_, size_}; }
  bool operator==(const TierPayload& o) const { return span() == o.span(); }

 private:
  std::unique_ptr<uint8_t[]> heap_;
  std::shared_ptr<void> owner_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One full KV block as the tiers below the pool keep it: its prefix-cache identity (hash, parent
// hash, cache salt, token ids: what BlockPool::Register records, so that a block loaded back is
// matched exactly as a pool hit is) and its bytes (every layer region of the block, layer order,
// KvCacheSpec::bytes_per_block()). Immutable once made: the tiers share it by pointer.
struct TierBlock {
  BlockHash hash = 0;
  BlockHash parent = 0;
  uint64_t salt = 0;
  std::vector<int32_t> tokens;
  TierPayload payload;

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
// hash is not `expected_hash`. A block that passes is byte for byte what was encoded; its payload
// goes where `payload_memory` (when given) puts it (a host tier slot), else on the heap.
using TierPayloadSource = std::function<TierPayload(size_t bytes)>;
absl::StatusOr<TierBlock> DecodeTierBlock(absl::Span<const uint8_t> bytes, uint64_t fingerprint,
                                          BlockHash expected_hash,
                                          const TierPayloadSource& payload_memory = nullptr);

}  // namespace tandem
