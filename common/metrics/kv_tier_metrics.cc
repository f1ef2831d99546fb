#include "common/metrics/kv_tier_metrics.h"

#include <string>

#include "common/metrics/buckets.h"
#include "common/metrics/counter_delta.h"

namespace tandem {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

constexpr std::array<const char*, 2> kTiers = {"host", "disk"};

}  // namespace

KvTierMetrics::KvTierMetrics(prometheus::Registry* registry, std::string_view role) {
  const std::string r(role);
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(*registry);
  };
  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(*registry);
  };
  auto* enabled = gauge("tandem_kv_tier_enabled",
                        "1 while the KV cache tier serves, 0 once it turned itself off (or is "
                        "not configured).");
  auto* capacity = gauge("tandem_kv_tier_capacity_bytes", "Bytes the KV cache tier may hold.");
  auto* usage = gauge("tandem_kv_tier_usage_bytes", "Bytes of KV blocks the tier holds now.");
  auto* blocks = gauge("tandem_kv_tier_blocks", "KV blocks the tier holds now.");
  auto* hits = counter("tandem_kv_tier_hits_total", "Blocks a load found in this tier.");
  auto* misses =
      counter("tandem_kv_tier_misses_total",
              "Blocks a load looked for in this tier and did not find or found corrupt.");
  auto* corrupt = counter("tandem_kv_tier_corrupt_blocks_total",
                          "Blocks that failed their checks on read (deleted and recomputed).");
  auto* read = counter("tandem_kv_tier_read_bytes_total", "Bytes loads read from this tier.");
  auto* written = counter("tandem_kv_tier_written_bytes_total", "Bytes written into this tier.");
  auto* evictions = counter("tandem_kv_tier_evictions_total",
                            "Blocks the tier dropped (least recently used) to make room.");
  auto* disabled = counter("tandem_kv_tier_disabled_total",
                           "Times the tier turned itself off (disk full, read-only, refused).");
  auto* pinned_memory =
      gauge("tandem_kv_tier_pinned_memory_bytes",
            "Page-locked host memory the KV cache tier holds (allocated at start; the host tier "
            "of a GPU worker).");
  for (size_t t = 0; t < kTiers.size(); ++t) {
    const prometheus::Labels l = {{"role", r}, {"tier", kTiers[t]}};
    tier_[t] =
        Tier{&enabled->Add(l), &capacity->Add(l),  &usage->Add(l),    &blocks->Add(l),
             &hits->Add(l),    &misses->Add(l),    &corrupt->Add(l),  &read->Add(l),
             &written->Add(l), &evictions->Add(l), &disabled->Add(l), &pinned_memory->Add(l)};
  }
  const prometheus::Labels l = {{"role", r}};
  queue_blocks_ = &gauge("tandem_kv_tier_write_queue_blocks",
                         "KV blocks queued for the disk tier (write-behind) now.")
                       ->Add(l);
  queue_bytes_ = &gauge("tandem_kv_tier_write_queue_bytes",
                        "Bytes queued for the disk tier (write-behind) now.")
                      ->Add(l);
  drops_ = &counter("tandem_kv_tier_write_drops_total",
                    "Evicted KV blocks not written to the disk tier because its queue was full.")
                ->Add(l);
  loaded_blocks_ = &counter("tandem_kv_tier_loaded_blocks_total",
                            "KV blocks loaded from the tiers into the pool (prefill saved).")
                        ->Add(l);
  loads_in_flight_ = &gauge("tandem_kv_tier_loads_in_flight",
                            "Requests waiting for their prefix blocks to load from the tiers.")
                          ->Add(l);
  pinned_ =
      &gauge("tandem_kv_tier_pinned_blocks", "Loaded KV blocks held for requests not admitted yet.")
           ->Add(l);
  load_seconds_ = &BuildHistogram()
                       .Name("tandem_kv_tier_load_duration_seconds")
                       .Help("Time from a request's load being queued to its blocks being ready.")
                       .Register(*registry)
                       .Add(l, buckets::InterTokenSeconds());
}

void KvTierMetrics::OnLoad(double seconds, int64_t /*blocks*/) { load_seconds_->Observe(seconds); }

void KvTierMetrics::OnTierDisabled(const char* tier) {
  for (size_t t = 0; t < kTiers.size(); ++t) {
    if (std::string(tier) == kTiers[t]) {
      tier_[t].disabled->Increment();
      tier_[t].enabled->Set(0);
    }
  }
}

void KvTierMetrics::OnStats(const KvTierStats& s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t t = 0; t < kTiers.size(); ++t) {
    const KvTierCounters& now = s.tier[t];
    const KvTierCounters& last = last_.tier[t];
    const Tier& m = tier_[t];
    m.enabled->Set(now.enabled ? 1 : 0);
    m.capacity->Set(static_cast<double>(now.capacity_bytes));
    m.pinned_memory->Set(static_cast<double>(now.pinned_bytes));
    m.usage->Set(static_cast<double>(now.used_bytes));
    m.blocks->Set(static_cast<double>(now.blocks));
    AddCounterDelta(m.hits, now.hits, last.hits);
    AddCounterDelta(m.misses, now.misses, last.misses);
    AddCounterDelta(m.corrupt, now.corrupt, last.corrupt);
    AddCounterDelta(m.read_bytes, now.bytes_out, last.bytes_out);
    AddCounterDelta(m.written_bytes, now.bytes_in, last.bytes_in);
    AddCounterDelta(m.evictions, now.evictions, last.evictions);
  }
  queue_blocks_->Set(static_cast<double>(s.write_queue_blocks));
  queue_bytes_->Set(static_cast<double>(s.write_queue_bytes));
  AddCounterDelta(drops_, s.write_drops, last_.write_drops);
  AddCounterDelta(loaded_blocks_, s.loaded_blocks, last_.loaded_blocks);
  loads_in_flight_->Set(static_cast<double>(s.loads_in_flight));
  pinned_->Set(static_cast<double>(s.pinned_blocks));
  last_ = s;
}

}  // namespace tandem
