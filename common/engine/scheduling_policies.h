#pragma once

// Scheduling policies a binary adds to the names `--scheduling-policy` accepts, beyond the
// production ones (fcfs, priority: SchedulerOptions::policy). Each is an EngineOptions::extensions
// factory (a batching policy and features) made per engine. Only benchmark binaries register any
// (tests/bench/static_batching: the static-batching baselines); `tandem` registers none, so a
// user can never select one. Register before parsing flags; thread-safe.

#include <string>
#include <vector>

#include "common/engine/engine_types.h"

namespace tandem {

void RegisterSchedulingPolicy(const std::string& name, EngineExtensionFactory factory);
// The factory registered under `name`; null when there is none.
EngineExtensionFactory FindSchedulingPolicy(const std::string& name);
// The registered names, sorted.
std::vector<std::string> RegisteredSchedulingPolicies();

}  // namespace tandem
