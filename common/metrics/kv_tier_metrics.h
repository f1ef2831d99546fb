#pragma once

#include <array>
#include <mutex>
#include <string>
#include <string_view>

#include "common/engine/kv/tiers/kv_tier_hooks.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// Metric families of one engine's KV cache tiers (common/engine/kv/tiers; docs/operations.md
// "KV cache tiers"), labelled with the worker role and, per tier, tier="host" | "disk". Fed
// through KvTierHooks. Thread-safe.
//
//   tandem_kv_tier_enabled / _capacity_bytes / _usage_bytes / _blocks{tier}        gauges
//   tandem_kv_tier_hits_total / _misses_total / _corrupt_blocks_total{tier}         counters
//   tandem_kv_tier_read_bytes_total / _written_bytes_total / _evictions_total{tier} counters
//   tandem_kv_tier_disabled_total{tier}                                             counter
//   tandem_kv_tier_write_queue_blocks / _write_queue_bytes                          gauges
//   tandem_kv_tier_write_drops_total, tandem_kv_tier_loaded_blocks_total            counters
//   tandem_kv_tier_loads_in_flight, tandem_kv_tier_pinned_blocks                    gauges
//   tandem_kv_tier_load_duration_seconds                                            histogram
class KvTierMetrics : public KvTierHooks {
 public:
  KvTierMetrics(prometheus::Registry* registry, std::string_view role);
  KvTierMetrics(const KvTierMetrics&) = delete;
  KvTierMetrics& operator=(const KvTierMetrics&) = delete;

  void OnLoad(double seconds, int64_t blocks) override;
  void OnTierDisabled(const char* tier) override;
  void OnStats(const KvTierStats& stats) override;

 private:
  struct Tier {
    prometheus::Gauge* enabled;
    prometheus::Gauge* capacity;
    prometheus::Gauge* usage;
    prometheus::Gauge* blocks;
    prometheus::Counter* hits;
    prometheus::Counter* misses;
    prometheus::Counter* corrupt;
    prometheus::Counter* read_bytes;
    prometheus::Counter* written_bytes;
    prometheus::Counter* evictions;
    prometheus::Counter* disabled;
    prometheus::Gauge* pinned_memory;
  };
  std::array<Tier, 2> tier_;
  prometheus::Gauge* queue_blocks_;
  prometheus::Gauge* queue_bytes_;
  prometheus::Counter* drops_;
  prometheus::Counter* loaded_blocks_;
  prometheus::Gauge* loads_in_flight_;
  prometheus::Gauge* pinned_;
  prometheus::Histogram* load_seconds_;

  std::mutex mu_;
  KvTierStats last_;
};

}  // namespace tandem
