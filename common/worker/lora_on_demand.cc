#include "common/worker/lora_on_demand.h"

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {

absl::StatusOr<uint64_t> AcquireRequestLora(LoraRegistry* registry, const std::string& name,
                                            const std::string& path) {
  if (name.empty()) return uint64_t{0};
  if (registry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: '", name, "' names a LoRA adapter but LoRA is not enabled (--enable-lora)"));
  }
  if (!path.empty()) {
    std::string evicted;
    if (absl::Status st = registry->Acquire(name, path, &evicted); !st.ok()) return st;
    if (!evicted.empty()) {
      TLOG(INFO) << "LoRA adapter '" << name << "' loaded on demand from " << path
                 << "; unloaded the least recently used '" << evicted << "'";
    }
  }
  std::shared_ptr<const LoraAdapter> adapter = registry->Find(name);
  if (adapter == nullptr) {
    return absl::NotFoundError(absl::StrCat("model: LoRA adapter '", name, "' is not loaded"));
  }
  return adapter->cache_key;
}

void AddLoraStats(const LoraRegistry* registry, v1::WorkerStats* stats) {
  if (registry == nullptr) return;
  stats->set_max_cpu_loras(registry->options().loaded_limit());
  for (const LoraInfo& info : registry->List()) {
    v1::LoraAdapterState* a = stats->add_lora_adapters();
    a->set_name(info.name);
    a->set_path(info.path);
    a->set_cache_key(info.cache_key);
    a->set_in_use(info.in_use);
  }
}

}  // namespace tandem
