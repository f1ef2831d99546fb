#include "common/worker/kv_event_log.h"

namespace tandem {

void KvEventLog::Stored(BlockHash hash) { Append(hash, true); }
void KvEventLog::Removed(BlockHash hash) { Append(hash, false); }

void KvEventLog::Append(BlockHash hash, bool stored) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stored) {
    cached_.insert(hash);
  } else {
    cached_.erase(hash);
  }
  events_.push_back({hash, stored});
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
    d.stored.assign(cached_.begin(), cached_.end());
    return d;
  }
  for (uint64_t s = cursor; s < end; ++s) {
    const Event& e = events_[s - first_seq_];
    (e.stored ? d.stored : d.removed).push_back(e.hash);
  }
  return d;
}

}  // namespace tandem
