#include "router/lora_routing.h"

#include <algorithm>
#include <limits>

namespace tandem {

bool WorkerHasLora(const Worker& worker, const std::string& name, absl::Time now) {
  std::lock_guard<std::mutex> lock(worker.mu);
  for (const v1::LoraAdapterState& a : worker.stats.lora_adapters()) {
    if (a.name() == name) return true;
  }
  auto it = worker.lora_pending.find(name);
  return it != worker.lora_pending.end() && it->second > now;
}

std::vector<std::shared_ptr<Worker>> LoraAffinity(
    const std::vector<std::shared_ptr<Worker>>& workers, const std::string& name, absl::Time now,
    const RoutingOptions* bound) {
  if (name.empty()) return workers;
  std::vector<std::shared_ptr<Worker>> holding;
  std::vector<std::shared_ptr<Worker>> enabled;
  for (const auto& w : workers) {
    if (WorkerHasLora(*w, name, now)) {
      holding.push_back(w);
    } else {
      std::lock_guard<std::mutex> lock(w->mu);
      if (w->stats.max_cpu_loras() > 0) enabled.push_back(w);
    }
  }
  if (holding.empty()) return enabled;
  if (bound != nullptr && !enabled.empty()) {
    int64_t least = std::numeric_limits<int64_t>::max();
    for (const auto* group : {&holding, &enabled}) {
      for (const auto& w : *group) least = std::min(least, w->inflight_blocks.load());
    }
    const double limit = bound->max_imbalance * static_cast<double>(least) +
                         static_cast<double>(bound->imbalance_slack_blocks);
    bool all_over = true;
    for (const auto& w : holding) {
      if (static_cast<double>(w->inflight_blocks.load()) <= limit) all_over = false;
    }
    if (all_over) holding.insert(holding.end(), enabled.begin(), enabled.end());
  }
  return holding;
}

uint64_t ReportedLoraCacheKey(const std::vector<std::shared_ptr<Worker>>& workers,
                              const std::string& name) {
  if (name.empty()) return 0;
  for (const auto& w : workers) {
    std::lock_guard<std::mutex> lock(w->mu);
    for (const v1::LoraAdapterState& a : w->stats.lora_adapters()) {
      if (a.name() == name) return a.cache_key();
    }
  }
  return 0;
}

}  // namespace tandem
