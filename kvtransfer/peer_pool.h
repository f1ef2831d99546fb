#pragma once

// The bound on peers of the device transports (an nccl communicator holds device memory and
// NCCL resources): when a pool is full, the least recently used entry that is idle makes room;
// if none is idle the caller refuses the new peer (RESOURCE_EXHAUSTED).

#include <memory>

#include "absl/time/time.h"

namespace tandem::kvtransfer {

// `Map` maps keys to std::shared_ptr<T>, T having `absl::Time last_used() const` and
// `bool idle() const`.
// Returns the entry to evict, or m.end() when every entry is busy.
template <typename Map>
typename Map::iterator PickVictim(Map& m) {
  auto victim = m.end();
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it->second->idle()) continue;
    if (victim == m.end() || it->second->last_used() < victim->second->last_used()) victim = it;
  }
  return victim;
}

}  // namespace tandem::kvtransfer
