#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "common/engine/kv/tiers/tier_block.h"
#include "common/engine/kv/tiers/tier_options.h"

namespace tandem {

struct DiskTierOptions {
  std::string dir;  // the user's directory; blocks go in dir/tandem-kv-<fingerprint>/
  int64_t capacity_bytes = 0;
  uint64_t fingerprint = 0;
  KvTierHooks* hooks = nullptr;
  KvTierListener* listener = nullptr;  // hears every block indexed and dropped (may be null)
};

// The local-disk tier (README.md "Disk tier"): one file per block, named by its hash, in a
// directory per fingerprint, written to a temporary name and renamed (a reader never sees a
// partial file under a block's name), checked on every read (header, checksum, hash chain: a torn
// or altered file is a miss and is deleted). Least recently used files are deleted to stay within
// the capacity. A worker restarted on the same directory finds its blocks again (the index is
// rebuilt from the files, oldest modification first). A write that fails for lack of space or
// permission (ENOSPC, EDQUOT, EFBIG, EROFS, EACCES, EPERM, EIO) turns the tier off: one log line,
// KvTierHooks::OnTierDisabled, every later call a miss. Thread-safe: the store's writer thread
// calls Put, its loader thread Get, the engine thread Contains.
class DiskTier {
 public:
  // Creates dir (0700) and the fingerprint's directory, refuses a directory another user owns or
  // others may write, takes an exclusive lock (a second worker on the same directory and
  // fingerprint is refused: FAILED_PRECONDITION), deletes temporary files a killed writer left,
  // and indexes the blocks already there.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();

  bool enabled() const { return enabled_.load(); }
  bool Contains(BlockHash hash) const;
  bool Touch(BlockHash hash);
  // Writes `block` unless it is here already or larger than the capacity.
  void Put(const TierBlock& block);
  // The block under `hash` when its file passes every check; otherwise nullopt (a miss). Its
  // payload goes where `payload_memory` puts it (DecodeTierBlock).
  std::optional<TierBlock> Get(BlockHash hash, const TierPayloadSource& payload_memory = nullptr);
  KvTierCounters counters() const;
  const std::string& path() const { return path_; }
  // Turns the tier off (logged once).
  void Disable(const std::string& why);

 private:
  struct Entry {
    BlockHash hash;
    int64_t bytes;
  };
  using Lru = std::list<Entry>;  // front: least recently used

  DiskTier(const DiskTierOptions& options, std::string path, int lock_fd);
  std::string FileOf(BlockHash hash) const;
  void Scan();
  // Evicts least recently used files until `bytes` more fit. mu_ held.
  void MakeRoomLocked(int64_t bytes);
  void EraseLocked(BlockHash hash);

  const DiskTierOptions options_;
  const std::string path_;
  const int lock_fd_;
  std::atomic<bool> enabled_{true};
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<BlockHash, Lru::iterator> index_;
  int64_t reserved_ = 0;  // bytes of writes in progress
  KvTierCounters c_;
  uint64_t next_temp_ = 0;
};

}  // namespace tandem
