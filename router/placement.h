#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// Hashes of the full blocks of the tokens (prompt and prior output) a worker would hold for
// `request`: the keys its prefix cache is looked up by. A request for a LoRA adapter salts them
// with the adapter's cache key as the workers do (SaltWithAdapter); with its key unknown
// (`lora_cache_key` 0: no worker reports the adapter) there are none, as no worker can hold any.
std::vector<uint64_t> PromptBlockHashes(const v1::DecodeRequest& request, int64_t block_size,
                                        uint64_t lora_cache_key = 0);

// One candidate per worker: its cached prefix of `hashes` at `now` (in its pool, then in its KV
// cache tiers, with their measured costs) and its load in KV blocks.
std::vector<RouteCandidate> RouteCandidates(const std::vector<std::shared_ptr<Worker>>& workers,
                                            const std::vector<uint64_t>& hashes, absl::Time now);

// The cluster's KV block size (16 before any worker has registered).
int64_t ClusterBlockSize(const WorkerRegistry& registry);

}  // namespace tandem
