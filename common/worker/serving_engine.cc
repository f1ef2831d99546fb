#include "common/worker/serving_engine.h"

#include <string>
#include <utility>
#include <vector>

#include "common/engine/backend/cpu/cpu_backend.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<ServingEngine>> StartServingEngine(const EngineBuildOptions& options,
                                                                  const std::string& spec_method,
                                                                  prometheus::Registry* registry,
                                                                  const std::string& role) {
  auto s = std::make_unique<ServingEngine>();
  EngineBuildOptions build = options;
  if (build.engine.kv_tiers.enabled()) {
    s->tier_metrics = std::make_unique<KvTierMetrics>(registry, role);
    build.engine.kv_tiers.hooks = s->tier_metrics.get();
    s->tier_events = std::make_unique<TierEventForwarder>(&s->events);
    build.engine.kv_tiers.listener = s->tier_events.get();
  }
  auto built = BuildEngine(build);
  if (!built.ok()) return built.status();
  s->model = built->model;
  s->backend = &built->engine->backend();
  s->max_model_len = built->engine->max_model_len();
  KvEventLog* events = &s->events;
  built->engine->block_pool().set_listener({[events](BlockHash h) { events->Stored(h); },
                                            [events](BlockHash h) { events->Removed(h); }});
  s->metrics = std::make_unique<EngineMetrics>(registry, role);
  const auto* cpu = dynamic_cast<const CpuBackend*>(s->backend);
  RegisterBackendInfo(
      registry, role, s->backend->name(),
      cpu != nullptr ? cpu->InfoLabels() : std::vector<std::pair<std::string, std::string>>{});
  if (options.engine.spec.method != SpecOptions::Method::kNone) {
    s->spec_metrics = std::make_unique<SpecMetrics>(registry, spec_method);
    built->engine->set_spec_hooks(s->spec_metrics.get());
  }
  s->engine = std::make_unique<AsyncEngine>(std::move(built->engine), s->metrics.get());
  return s;
}

}  // namespace tandem
