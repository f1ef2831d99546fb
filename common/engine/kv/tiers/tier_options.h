#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace tandem {

class KvTierHooks;

// The tiers below the KV pool (README.md). Defaults: every tier off.
struct KvTierOptions {
  // Host tier: bytes of process memory for evicted blocks (GPU worker: the level below device
  // memory; CPU worker, whose pool is host memory already: a second-level host cache that keeps
  // evicted blocks without the pool's per-block layout constraints). 0: off.
  int64_t host_bytes = 0;
  // Disk tier: a directory private to this worker (created 0700) and its size. Empty dir: off.
  std::string disk_dir;
  int64_t disk_bytes = int64_t{16} << 30;
  // Write-behind to the disk tier: blocks queued beyond this many bytes are dropped (counted),
  // never waited for; writes are paced to this many bytes per second (0: unpaced).
  int64_t write_queue_bytes = int64_t{256} << 20;
  int64_t write_bytes_per_second = int64_t{1} << 30;
  // Identity of everything that changes a block's bytes (model weights, weight format, KV dtype,
  // layout, block size, backend and kernels): blocks written under another fingerprint are never
  // read. Set by BuildEngine (KvTierFingerprint); required with a disk tier.
  uint64_t fingerprint = 0;
  // Loads in flight at most, and blocks loaded but not yet taken by their request at most
  // (as a fraction of the pool): a bound on what waiting requests hold.
  int64_t max_loads_in_flight = 64;
  double max_pinned_fraction = 0.5;
  // Metrics (null: none). Called from the tiers' threads and the engine thread.
  KvTierHooks* hooks = nullptr;

  bool enabled() const { return host_bytes > 0 || !disk_dir.empty(); }
};

enum class KvTier { kHost = 0, kDisk = 1 };
inline constexpr std::array<const char*, 2> kKvTierNames = {"host", "disk"};

// Counters of one tier (cumulative) and its state (current).
struct KvTierCounters {
  bool enabled = false;
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;
  int64_t blocks = 0;
  int64_t hits = 0;       // blocks a load found here
  int64_t misses = 0;     // blocks a load looked for here and did not find (or found corrupt)
  int64_t corrupt = 0;    // of the misses: found but failed the checks (then deleted)
  int64_t bytes_in = 0;   // written into this tier
  int64_t bytes_out = 0;  // read from it by loads
  int64_t evictions = 0;  // blocks dropped to make room
};

struct KvTierStats {
  bool enabled = false;
  std::array<KvTierCounters, 2> tier;  // by KvTier
  int64_t write_queue_blocks = 0;      // write-behind queue depth now
  int64_t write_queue_bytes = 0;
  int64_t write_drops = 0;      // blocks not written because the queue was full (cumulative)
  int64_t loads = 0;            // loads finished (cumulative)
  int64_t loaded_blocks = 0;    // blocks loaded into the pool (cumulative)
  int64_t loads_in_flight = 0;  // now
  int64_t pinned_blocks = 0;    // loaded, waiting for their request's admission (now)
  int64_t cancelled_loads = 0;  // whose request ended before they finished (cumulative)
};

}  // namespace tandem
