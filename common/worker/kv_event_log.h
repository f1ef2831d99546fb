#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "common/cluster/block_hash.h"

namespace tandem {

// Where a block is held: the pool, or a KV cache tier below it (values of v1::KvMedium).
enum class KvMedium : uint8_t { kPool = 0, kHost = 1, kDisk = 2 };

// The prefix-cache events of one worker (block hashes stored / removed, per medium), kept for the
// routers that watch them. The engine thread appends pool events (BlockPool listener), the KV
// tiers' threads their own; watcher threads read from a cursor. The live set of hashes per medium
// is mirrored here so a new watcher starts from a snapshot without asking the engine thread.
// Thread-safe.
class KvEventLog {
 public:
  explicit KvEventLog(size_t max_events = 1 << 20) : max_events_(max_events) {}

  void Stored(BlockHash hash, KvMedium medium = KvMedium::kPool);
  void Removed(BlockHash hash, KvMedium medium = KvMedium::kPool);

  struct Delta {
    bool snapshot = false;  // `stored` (and tier_stored) is the full set; the watcher drops what
                            // it had
    std::vector<BlockHash> stored;  // the pool's
    std::vector<BlockHash> removed;
    // The tiers' below the pool, by medium - 1 (host, disk).
    std::array<std::vector<BlockHash>, 2> tier_stored;
    std::array<std::vector<BlockHash>, 2> tier_removed;
    uint64_t next_cursor = 0;
  };
  // Events after `cursor` (0: start with a snapshot). A cursor that fell out of the retained
  // window also gets a snapshot.
  Delta Read(uint64_t cursor) const;

 private:
  struct Event {
    BlockHash hash;
    bool stored;
    KvMedium medium;
  };
  void Append(BlockHash hash, bool stored, KvMedium medium);

  const size_t max_events_;
  mutable std::mutex mu_;
  std::deque<Event> events_;
  uint64_t first_seq_ = 1;                               // sequence number of events_.front()
  std::array<std::unordered_set<BlockHash>, 3> cached_;  // by medium
};

}  // namespace tandem
