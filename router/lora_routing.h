#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace tandem {

// Adapter affinity: where a request for a LoRA adapter may run. Workers report the
// adapters they hold in their stats (WorkerStats.lora_adapters, with each one's cache key) and
// load one on demand when a request names it with its path (DecodeRequest.lora_path), evicting
// their least recently used adapter that no request holds (LoraRegistry::Acquire).

// Whether `worker` holds adapter `name`: its latest stats list it, or a request for it was
// routed there within the pending time (Worker::NoteLoraRouted), so a burst for a new adapter
// follows the first request instead of loading it on every worker before a report arrives.
bool WorkerHasLora(const Worker& worker, const std::string& name, absl::Time now);

// The workers a request for adapter `name` goes to: those that hold it (adapter affinity; the
// routing policy then picks among them by prefix and load); when none does, those with LoRA on
// (one loads it on demand). With `bound`, when every holder's load (Worker::inflight_blocks) is
// over its imbalance bound (max_imbalance x the least loaded LoRA worker's + slack), the others
// with LoRA on join them, so one hot adapter spreads to another worker instead of piling onto
// its holders. `name` empty (the base model): every worker.
std::vector<std::shared_ptr<Worker>> LoraAffinity(
    const std::vector<std::shared_ptr<Worker>>& workers, const std::string& name, absl::Time now,
    const RoutingOptions* bound = nullptr);

// Adapter `name`'s cache key as the workers report it (0: none reports it). Workers that loaded
// one name from one path report one key; the prefix cache salts the adapter's requests with it.
uint64_t ReportedLoraCacheKey(const std::vector<std::shared_ptr<Worker>>& workers,
                              const std::string& name);

}  // namespace tandem
