#include "common/engine/lora/lora_registry.h"

#include <optional>
#include <set>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status ValidateLoraOptions(const LoraOptions& o) {
  if (o.max_loras < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-loras must be >= 1, got ", o.max_loras));
  }
  if (o.max_lora_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-lora-rank must be >= 1, got ", o.max_lora_rank));
  }
  if (o.max_cpu_loras != 0 && o.max_cpu_loras < o.max_loras) {
    return absl::InvalidArgumentError(absl::StrCat("--max-cpu-loras (", o.max_cpu_loras,
                                                   ") must be >= --max-loras (", o.max_loras, ")"));
  }
  if (o.dtype != "auto" && o.dtype != "float32" && o.dtype != "bfloat16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--lora-dtype must be auto, float32 or bfloat16, got '", o.dtype, "'"));
  }
  std::set<std::string> names;
  for (const std::string& m : o.modules) {
    const size_t eq = m.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == m.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora-modules: '", m, "' is not of the form name=path"));
    }
    if (!names.insert(m.substr(0, eq)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora-modules: the name '", m.substr(0, eq), "' is given twice"));
    }
  }
  if (static_cast<int64_t>(o.modules.size()) > o.loaded_limit()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lora-modules: ", o.modules.size(), " adapters but at most ", o.loaded_limit(),
        " may be loaded (--max-cpu-loras, or --max-loras when it is not set)"));
  }
  return absl::OkStatus();
}

LoraRegistry::LoraRegistry(ModelConfig config, LoraOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  limits_.max_lora_rank = options_.max_lora_rank;
  limits_.dtype = options_.resolved_dtype();
}

absl::Status LoraRegistry::Load(const std::string& name, const std::string& dir) {
  if (name.empty() || name.size() > 256 || name.find_first_of(" \t\r\n=") != std::string::npos) {
    return absl::InvalidArgumentError(
        "lora_name: must be 1 to 256 characters without whitespace or '='");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (adapters_.count(name) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("LoRA adapter '", name, "' is already loaded"));
    }
  }
  // Read outside the lock: loading takes milliseconds to seconds.
  auto adapter = LoadLoraAdapter(name, dir, config_, limits_);
  if (!adapter.ok()) return adapter.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (adapters_.count(name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("LoRA adapter '", name, "' is already loaded"));
  }
  if (static_cast<int64_t>(adapters_.size()) >= options_.loaded_limit()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot load LoRA adapter '", name, "': ", adapters_.size(),
                     " are loaded, the limit (--max-cpu-loras) is ", options_.loaded_limit(),
                     "; unload one first"));
  }
  adapters_.emplace(name, *std::move(adapter));
  last_used_[name] = ++use_clock_;
  return absl::OkStatus();
}

absl::Status LoraRegistry::Acquire(const std::string& name, const std::string& dir,
                                   std::string* evicted) {
  auto loaded_here = [&]() -> std::optional<absl::Status> {
    auto it = adapters_.find(name);
    if (it == adapters_.end()) return std::nullopt;
    if (it->second->path != dir) {
      return absl::FailedPreconditionError(absl::StrCat("LoRA adapter '", name,
                                                        "' is loaded here from ", it->second->path,
                                                        ", not from ", dir, " (unload it first)"));
    }
    last_used_[name] = ++use_clock_;
    return absl::OkStatus();
  };
  if (name.empty() || name.size() > 256 || name.find_first_of(" \t\r\n=") != std::string::npos) {
    return absl::InvalidArgumentError(
        "lora_name: must be 1 to 256 characters without whitespace or '='");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto st = loaded_here()) return *st;
  }
  auto adapter = LoadLoraAdapter(name, dir, config_, limits_);  // outside the lock
  if (!adapter.ok()) return adapter.status();
  std::shared_ptr<const LoraAdapter> victim;  // freed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (auto st = loaded_here()) return *st;  // another call loaded it meanwhile
  if (static_cast<int64_t>(adapters_.size()) >= options_.loaded_limit()) {
    auto lru = adapters_.end();
    for (auto it = adapters_.begin(); it != adapters_.end(); ++it) {
      if (it->second.use_count() > 1) continue;  // a request holds it
      if (lru == adapters_.end() || last_used_[it->first] < last_used_[lru->first]) lru = it;
    }
    if (lru == adapters_.end()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot load LoRA adapter '", name, "': the ", adapters_.size(),
                       " loaded (--max-cpu-loras) are all in use by requests"));
    }
    if (evicted != nullptr) *evicted = lru->first;
    victim = std::move(lru->second);
    last_used_.erase(lru->first);
    adapters_.erase(lru);
  }
  adapters_.emplace(name, *std::move(adapter));
  last_used_[name] = ++use_clock_;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LoraRegistry::Unload(const std::string& name) {
  std::shared_ptr<const LoraAdapter> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = adapters_.find(name);
    if (it == adapters_.end()) {
      return absl::NotFoundError(absl::StrCat("LoRA adapter '", name, "' is not loaded"));
    }
    gone = std::move(it->second);
    adapters_.erase(it);
    last_used_.erase(name);
  }
  // Holders other than this function's copy (use_count is exact only at quiescence).
  return static_cast<int64_t>(gone.use_count()) - 1;
}

std::shared_ptr<const LoraAdapter> LoraRegistry::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = adapters_.find(name);
  if (it == adapters_.end()) return nullptr;
  last_used_[name] = ++use_clock_;
  return it->second;
}

std::vector<LoraInfo> LoraRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LoraInfo> out;
  for (const auto& [name, a] : adapters_) {
    out.push_back({name, a->path, a->rank, static_cast<int64_t>(a.use_count()) - 1, a->cache_key});
  }
  return out;
}

size_t LoraRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return adapters_.size();
}

absl::StatusOr<std::shared_ptr<LoraRegistry>> MakeLoraRegistry(const ModelConfig& config,
                                                               const LoraOptions& options) {
  if (!options.enable_lora && options.modules.empty()) return nullptr;
  if (auto st = ValidateLoraOptions(options); !st.ok()) return st;
  auto registry = std::make_shared<LoraRegistry>(config, options);
  for (const std::string& m : options.modules) {
    const size_t eq = m.find('=');
    if (auto st = registry->Load(m.substr(0, eq), m.substr(eq + 1)); !st.ok()) return st;
  }
  return registry;
}

}  // namespace tandem
