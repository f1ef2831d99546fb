#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/lora/lora_registry.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// The LoRA adapter a worker request names (DecodeRequest / PrefillRequest lora_name), loaded on
// demand from its lora_path when this worker lacks it (LoraRegistry::Acquire: within
// --max-cpu-loras, evicting the least recently used adapter no request holds). Returns the
// adapter's cache key, 0 for the base model. Errors: INVALID_ARGUMENT when LoRA is off (`registry`
// null), NOT_FOUND when it is not loaded and no path came, Acquire's otherwise. Loading blocks the
// calling thread (milliseconds for a rank-16 adapter of a 1B model).
absl::StatusOr<uint64_t> AcquireRequestLora(LoraRegistry* registry, const std::string& name,
                                            const std::string& path);

// The adapters `registry` holds and its capacity, as WorkerStats reports them (nothing when
// null).
void AddLoraStats(const LoraRegistry* registry, v1::WorkerStats* stats);

}  // namespace tandem
