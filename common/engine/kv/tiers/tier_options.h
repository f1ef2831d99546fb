#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/cluster/block_hash.h"
#include "common/engine/kv/tiers/kv_tier_hooks.h"

namespace tandem {

class KvTierListener;

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
  // (as a fraction of the pool): a bound on what waiting requests hold (the only load in flight
  // may take more, up to what the pool can give: TierFeature).
  int64_t max_loads_in_flight = 64;
  double max_pinned_fraction = 0.5;
  // Metrics (null: none). Called from the tiers' threads and the engine thread.
  KvTierHooks* hooks = nullptr;
  // Told which blocks each tier holds (the KV events routers watch; null: none).
  KvTierListener* listener = nullptr;

  bool enabled() const { return host_bytes > 0 || !disk_dir.empty(); }
};

// KvTierStats, KvTierCounters: common/engine/kv/tiers/kv_tier_hooks.h (indexed by KvTier).
enum class KvTier { kHost = 0, kDisk = 1 };
inline constexpr std::array<const char*, 2> kKvTierNames = {"host", "disk"};

// Told when a tier starts or stops holding a block: the tier's KV events (a worker forwards them
// to the routers, whose prefix affinity then credits blocks in lower tiers). A disk tier opened
// on a directory that already holds blocks reports each of them as stored; one that turns itself
// off reports all of its blocks removed. Called from the tiers' threads and the engine thread,
// under a tier's lock: thread-safe, must not block or call back into the tiers.
class KvTierListener {
 public:
  virtual ~KvTierListener() = default;
  virtual void OnTierStored(KvTier tier, BlockHash hash) = 0;
  virtual void OnTierRemoved(KvTier tier, BlockHash hash) = 0;
};

}  // namespace tandem
