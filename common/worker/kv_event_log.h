#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "common/cluster/block_hash.h"

namespace tandem {

// The prefix-cache events of one worker (block hashes stored / removed), kept for the routers
// that watch them. The engine thread appends (BlockPool listener); watcher threads read from a
// cursor. The live set of cached hashes is mirrored here so a new watcher starts from a
// snapshot without asking the engine thread. Thread-safe.
class KvEventLog {
 public:
  explicit KvEventLog(size_t max_events = 1 << 20) : max_events_(max_events) {}

  void Stored(BlockHash hash);
  void Removed(BlockHash hash);

  struct Delta {
    bool snapshot = false;  // `stored` is the full set; the watcher drops what it had
    std::vector<BlockHash> stored;
    std::vector<BlockHash> removed;
    uint64_t next_cursor = 0;
  };
  // Events after `cursor` (0: start with a snapshot). A cursor that fell out of the retained
  // window also gets a snapshot.
  Delta Read(uint64_t cursor) const;

 private:
  struct Event {
    BlockHash hash;
    bool stored;
  };
  void Append(BlockHash hash, bool stored);

  const size_t max_events_;
  mutable std::mutex mu_;
  std::deque<Event> events_;
  uint64_t first_seq_ = 1;  // sequence number of events_.front()
  std::unordered_set<BlockHash> cached_;
};

}  // namespace tandem
