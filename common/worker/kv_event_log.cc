#include "common/worker/kv_event_log.h"

namespace tandem {

void KvEventLog::Stored(BlockHash hash, KvMedium medium) { Append(hash, true, medium); }
void KvEventLog::Removed(BlockHash hash, KvMedium medium) { Append(hash, false, medium); }

void KvEventLog::Append(BlockHash hash, bool stored, KvMedium medium) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unordered_set<BlockHash>& cached = cached_[static_cast<int>(medium)];
  if (stored) {
    cached.insert(hash);
  } else {
    cached.erase(hash);
  }
  events_.push_back({hash, stored, medium});
  while (events_.size() > max_events_) {
    events_.pop_front();
    ++first_seq_;
  }
}

KvEventLog::Delta KvEventLog::Read(uint64_t cursor) const {
  std::lock_guard<std::mutex> lock(mu_);
  Delta d;
  const uint64_t end = first_seq_ + events_.size();
  d.next_cursor = end;
  if (cursor == 0 || cursor < first_seq_) {
    d.snapshot = true;
    d.stored.assign(cached_[0].begin(), cached_[0].end());
    for (int t = 0; t < 2; ++t)
      d.tier_stored[t].assign(cached_[t + 1].begin(), cached_[t + 1].end());
    return d;
  }
  for (uint64_t s = cursor; s < end; ++s) {
    const Event& e = events_[s - first_seq_];
    if (e.medium == KvMedium::kPool) {
      (e.stored ? d.stored : d.removed).push_back(e.hash);
    } else {
      const int t = static_cast<int>(e.medium) - 1;
      (e.stored ? d.tier_stored[t] : d.tier_removed[t]).push_back(e.hash);
    }
  }
  return d;
}

}  // namespace tandem
