#include "common/engine/scheduling_policies.h"

#include <map>
#include <mutex>

namespace tandem {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, EngineExtensionFactory> policies;
};

Registry& GetRegistry() {
  static Registry* const registry = new Registry();
  return *registry;
}

}  // namespace

void RegisterSchedulingPolicy(const std::string& name, EngineExtensionFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.policies[name] = std::move(factory);
}

EngineExtensionFactory FindSchedulingPolicy(const std::string& name) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.policies.find(name);
  return it == r.policies.end() ? nullptr : it->second;
}

std::vector<std::string> RegisteredSchedulingPolicies() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.policies) names.push_back(name);
  return names;
}

}  // namespace tandem
