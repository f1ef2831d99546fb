#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/metrics/request_hooks.h"
#include "common/tokenizer/tokenizer.h"
#include "router/admin_service.h"
#include "router/cluster_client.h"
#include "router/cluster_lora_catalog.h"
#include "router/generation_service.h"
#include "router/worker_registry.h"

namespace tandem {

// The router's settings from the command line. The flags register straight onto `registry` and
// `cluster` (whose defaults they show); the few that take another form on the command line
// (address lists, the policy by name, seconds) start from those structs too and are folded into
// them by Create.
struct RouterFlags {
  RegistryOptions registry;       // --prefill-dns, --decode-dns
  ClusterOptions cluster;         // routing weights, disaggregation and prefill limits
  std::string prefill_addresses;  // comma-separated host:port
  std::string decode_addresses;
  std::string routing_policy;  // cluster.routing.policy by name
  double prefill_timeout_s;    // cluster.prefill_timeout
  double startup_timeout_s = 60;
  std::string model_name;  // empty: the workers'
  // How to dial workers (set by the command from its TLS flags; null: plaintext).
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  // --cluster-secret-file: the workers' secret, proven on every call to them.
  std::string cluster_secret_file;
  // LoRA adapters clients may select (name=path, paths on the workers' machines; workers load
  // them on demand), and runtime loading without API keys (ClusterLoraCatalog).
  std::vector<std::string> lora_modules;
  bool allow_runtime_lora_updating = false;

  RouterFlags();
  // Every flag of `tandem router` but --model.
  void Register(FlagSet* flags);
};

// The router's components, wired: tokenizer, worker registry, cluster client and services.
class RouterRuntime {
 public:
  // Loads the tokenizer from `model_dir`, starts discovery and waits (startup_timeout) for a
  // decode worker to learn the served model's limits. `hooks` (may be null; must outlive the
  // runtime) sees every request, placement, retry, migration and worker health change.
  static absl::StatusOr<std::unique_ptr<RouterRuntime>> Create(const RouterFlags& flags,
                                                               const std::string& model_dir,
                                                               RouterHooks* hooks = nullptr);
  ~RouterRuntime();

  std::vector<grpc::Service*> services() { return {generation_.get(), admin_.get()}; }
  GenerationService& generation() { return *generation_; }
  WorkerRegistry& registry() { return *registry_; }
  ClusterClient& client() { return *client_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  void Stop() { registry_->Stop(); }

 private:
  RouterRuntime() = default;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<ClusterClient> client_;
  std::unique_ptr<GenerationService> generation_;
  std::unique_ptr<ClusterLoraCatalog> lora_;
  std::unique_ptr<RouterAdminService> admin_;
};

}  // namespace tandem
