#pragma once

#include <cstdint>

namespace tandem {

// What the KV cache tiers report (implemented by KvTierMetrics). Header-only interface: the
// tiers call it without linking the metrics library. Thread-safe (tier threads and the engine
// thread call it).
class KvTierHooks {
 public:
  virtual ~KvTierHooks() = default;
  // One request's load from the tiers finished after `seconds` (queued to ready), `blocks` found.
  virtual void OnLoad(double seconds, int64_t blocks) = 0;
  // A tier turned itself off (`tier`: "host" or "disk"; the reason is logged once).
  virtual void OnTierDisabled(const char* tier) = 0;
};

}  // namespace tandem
