#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "router/lora_catalog.h"
#include "router/worker_registry.h"

namespace tandem {

// The LoRA adapters a cluster's router serves: the ones named at start (`--lora-modules
// name=path`, paths on the workers' machines), the ones loaded at runtime, and the ones its
// healthy workers report holding (a worker's own --lora-modules). The router links
// no engine code, so it never reads an adapter: workers load them (on demand when a request
// names one they lack, DecodeRequest.lora_path; at once on every worker with LoRA on through
// Load) and report what they hold (WorkerStats.lora_adapters), which routing uses
// (lora_routing.h). Thread-safe; Load and Unload block on the workers' calls (the admin API's
// threads).
class ClusterLoraCatalog : public LoraCatalog {
 public:
  // `allowed` says whether runtime loading is allowed now (API keys on, or
  // --allow-runtime-lora-updating).
  ClusterLoraCatalog(WorkerRegistry* registry, std::function<bool()> allowed,
                     absl::Duration rpc_timeout = absl::Seconds(60));

  // Adds the `name=path` modules (INVALID_ARGUMENT for a malformed or repeated one). Workers load
  // them on demand.
  absl::Status AddModules(const std::vector<std::string>& modules);

  std::vector<Entry> List() const override;
  bool Has(const std::string& name) const override;
  std::string Path(const std::string& name) const override;
  // Loads `name` on every healthy worker with LoRA on. A worker's refusal of the adapter (bad
  // files, rank over its limit, another base model, the name held from another directory)
  // fails the call with that worker's message and unloads it from the workers that took it; a
  // worker whose adapters are all in use (RESOURCE_EXHAUSTED) loads it on demand later. ALREADY_
  // EXISTS when the router serves the name already, FAILED_PRECONDITION when no worker has LoRA
  // on or loading is not allowed.
  absl::Status Load(const std::string& name, const std::string& path) override;
  // Forgets `name` (new requests for it get NOT_FOUND) and unloads it from every worker; returns
  // the requests still running with it there (they finish with it).
  absl::StatusOr<int64_t> Unload(const std::string& name) override;

 private:
  // The adapters served, name -> path: the router's, then those its workers report.
  std::map<std::string, std::string> Known() const;
  // Healthy workers (each once, whatever its roles) with LoRA on.
  std::vector<std::shared_ptr<Worker>> LoraWorkers() const;
  absl::Status CallWorker(Worker& worker, bool load, const std::string& name,
                          const std::string& path, int64_t* in_use) const;

  WorkerRegistry* registry_;
  std::function<bool()> allowed_;
  absl::Duration rpc_timeout_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> paths_;  // name -> path
  std::set<std::string> unloaded_;            // unloaded through the router since (re)loaded
};

}  // namespace tandem
