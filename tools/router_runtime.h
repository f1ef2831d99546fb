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
#include "router/generation_service.h"
#include "router/worker_registry.h"

namespace tandem {

// Flags of the router of a disaggregated cluster.
struct RouterFlags {
  std::string prefill_addresses;  // comma-separated host:port
  std::string decode_addresses;
  std::string prefill_dns;  // name:port, re-resolved (Kubernetes headless Service)
  std::string decode_dns;
  std::string routing_policy = "prefix_affinity";
  double w_overlap = 1.0;
  double w_load = 0.25;
  double max_imbalance = 1.25;
  int64_t disagg_min_uncached_tokens = 32;
  int64_t max_prefills_per_worker = 16;
  double prefill_timeout_s = 60;
  double startup_timeout_s = 60;
  std::string model_name;
  // How to dial workers (set by the command from its TLS flags; null: plaintext).
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;

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
  std::unique_ptr<RouterAdminService> admin_;
};

}  // namespace tandem
