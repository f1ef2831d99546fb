#pragma once

#include <array>
#include <cstdint>

namespace tandem {

// Counters of one KV cache tier (cumulative) and its state (current). The engine's tier module
// (common/engine/kv/tiers) fills them; they are declared here so that this header depends on
// nothing.
struct KvTierCounters {
  bool enabled = false;
  int64_t capacity_bytes = 0;
  // Page-locked host memory the tier holds (allocated at start; the host tier of a GPU worker).
  int64_t pinned_bytes = 0;
  int64_t used_bytes = 0;
  int64_t blocks = 0;
  int64_t hits = 0;       // blocks a load found here
  int64_t misses = 0;     // blocks a load looked for here and did not find (or found corrupt)
  int64_t corrupt = 0;    // of the misses: found but failed the checks (then deleted)
  int64_t bytes_in = 0;   // written into this tier
  int64_t bytes_out = 0;  // read from it by loads
  int64_t evictions = 0;  // blocks dropped to make room
  // Measured seconds to read one block from this tier (recent mean; 0: none read yet).
  double load_seconds_per_block = 0;
};

// Everything the tiers of one engine report: per tier (index: 0 host, 1 disk) and the
// write-behind queue and loads.
struct KvTierStats {
  bool enabled = false;
  std::array<KvTierCounters, 2> tier;
  int64_t write_queue_blocks = 0;  // write-behind queue depth now
  int64_t write_queue_bytes = 0;
  int64_t write_drops = 0;      // blocks not written because the queue was full (cumulative)
  int64_t loads = 0;            // loads finished (cumulative)
  int64_t loaded_blocks = 0;    // blocks loaded into the pool (cumulative)
  int64_t loads_in_flight = 0;  // now: requests waiting for blocks from the tiers
  int64_t pinned_blocks = 0;    // loaded, waiting for their request's admission (now)
  int64_t cancelled_loads = 0;  // whose request ended before they finished (cumulative)
  // Measured seconds to prefill one block's worth of prompt tokens (recent mean; 0: none yet):
  // what a tier hit saves, against the tier's load_seconds_per_block.
  double prefill_seconds_per_block = 0;
};

// What the KV cache tiers report (implemented by KvTierMetrics). Header-only interface: the
// tiers call it without linking the metrics library. Thread-safe (the tiers' threads and the
// engine thread call it); must not block.
class KvTierHooks {
 public:
  virtual ~KvTierHooks() = default;
  // One request's load from the tiers finished after `seconds` (queued to done), `blocks` found.
  virtual void OnLoad(double seconds, int64_t blocks) = 0;
  // A tier turned itself off (`tier`: "host" or "disk"; the reason is logged once).
  virtual void OnTierDisabled(const char* tier) = 0;
  // The tiers' counters now (after writes, loads and engine steps).
  virtual void OnStats(const KvTierStats& stats) = 0;
};

}  // namespace tandem
