#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/model_config.h"
#include "common/engine/lora/lora_adapter.h"

namespace tandem {

// Serving options (vLLM's flag names).
struct LoraOptions {
  bool enable_lora = false;  // --enable-lora (implied by --lora-modules)
  // --lora-modules: name=path, loaded at start.
  std::vector<std::string> modules;
  // --max-loras: distinct adapters among the requests admitted at once (so in any one batch);
  // requests for another adapter wait until one of these has no request left.
  int64_t max_loras = 1;
  int64_t max_lora_rank = 16;  // --max-lora-rank
  // --max-cpu-loras: adapters loaded at once (0: max_loras); at least max_loras.
  int64_t max_cpu_loras = 0;
  // --lora-dtype: what adapters are kept and computed in: auto (the base model's dtype: bf16 for
  // bf16 or quantized weights, f32 for f32 weights), float32 or bfloat16.
  std::string dtype = "auto";
  DType model_dtype = DType::kF32;  // what auto resolves to (set by BuildEngine)

  int64_t loaded_limit() const { return max_cpu_loras > 0 ? max_cpu_loras : max_loras; }
  // What adapters are kept in: dtype resolved (auto: model_dtype).
  DType resolved_dtype() const {
    return dtype == "float32" ? DType::kF32 : dtype == "bfloat16" ? DType::kBF16 : model_dtype;
  }
};

// Checks the options' numbers (max_loras >= 1, max_lora_rank >= 1, max_cpu_loras 0 or >=
// max_loras), the dtype's name, and each module's name=path form; names must be unique.
absl::Status ValidateLoraOptions(const LoraOptions& options);

// What a worker reports about one loaded adapter.
struct LoraInfo {
  std::string name;
  std::string path;
  int64_t rank = 0;
  int64_t in_use = 0;      // sequences (admitted or queued) holding it
  uint64_t cache_key = 0;  // LoraAdapter::cache_key
};

// The adapters a worker serves, by name. Thread-safe: the API threads load, unload and list;
// the engine thread resolves names at admission. Every adapter is shared
// (std::shared_ptr<const LoraAdapter>): unloading removes the name at once (new requests for it
// are refused) while the requests already holding it finish with it; its memory is freed with
// the last of them.
class LoraRegistry {
 public:
  LoraRegistry(ModelConfig config, LoraOptions options);

  // Loads `dir` under `name`. ALREADY_EXISTS when the name is taken, RESOURCE_EXHAUSTED when
  // max_cpu_loras are loaded, INVALID_ARGUMENT / NOT_FOUND for a bad adapter (LoadLoraAdapter).
  // The name must not be empty nor contain whitespace or '='.
  absl::Status Load(const std::string& name, const std::string& dir);
  // Loading on demand (a cluster router's request for an adapter this worker lacks): OK at once
  // when `name` is loaded from `dir` (FAILED_PRECONDITION when from another directory); else
  // loads it, and when max_cpu_loras are loaded first unloads the least recently used adapter
  // that no request holds (its name in `*evicted`; RESOURCE_EXHAUSTED when every one is held).
  // "Used" is Load, Acquire or Find (every request's admission).
  absl::Status Acquire(const std::string& name, const std::string& dir,
                       std::string* evicted = nullptr);
  // Removes `name` (NOT_FOUND when not loaded). Requests already using it go on with it; the
  // returned count is how many still do.
  absl::StatusOr<int64_t> Unload(const std::string& name);
  // The adapter loaded under `name`, or null.
  std::shared_ptr<const LoraAdapter> Find(const std::string& name) const;
  // Loaded adapters, by name.
  std::vector<LoraInfo> List() const;
  size_t size() const;

  const LoraOptions& options() const { return options_; }
  // What LoadLoraAdapter checks and converts with (from the options).
  const LoraLimits& limits() const { return limits_; }
  const ModelConfig& model_config() const { return config_; }

 private:
  const ModelConfig config_;
  const LoraOptions options_;
  LoraLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const LoraAdapter>> adapters_;
  // When each loaded adapter was last used (a counter, for the least recently used).
  mutable std::map<std::string, uint64_t> last_used_;
  mutable uint64_t use_clock_ = 0;
};

// Makes a registry for `config` with the modules of `options` loaded (the first bad one fails
// it). Null (and OK) when LoRA is not enabled.
absl::StatusOr<std::shared_ptr<LoraRegistry>> MakeLoraRegistry(const ModelConfig& config,
                                                               const LoraOptions& options);

}  // namespace tandem
