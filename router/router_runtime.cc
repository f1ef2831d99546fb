#include "router/router_runtime.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/log.h"
#include "common/rpc/call_auth.h"

namespace tandem {

RouterFlags::RouterFlags()
    : routing_policy(RoutingPolicyName(cluster.routing.policy)),
      prefill_timeout_s(absl::ToDoubleSeconds(cluster.prefill_timeout)) {}

void RouterFlags::Register(FlagSet* f) {
  RoutingOptions& routing = cluster.routing;
  f->String("prefill-addresses", &prefill_addresses, "prefill workers, host:port,host:port");
  f->String("decode-addresses", &decode_addresses, "decode workers, host:port,host:port");
  f->String("prefill-dns", &registry.prefill_dns, "prefill workers by DNS name:port, re-resolved");
  f->String("decode-dns", &registry.decode_dns, "decode workers by DNS name:port, re-resolved");
  f->String("routing-policy", &routing_policy, "round_robin, least_loaded or prefix_affinity");
  f->Double("w-overlap", &routing.w_overlap, "prefix_affinity weight of uncached prompt blocks");
  f->Double("w-load", &routing.w_load, "prefix_affinity weight of a worker's active blocks");
  f->Double("max-imbalance", &routing.max_imbalance, "active-block ratio bound between workers");
  f->Double("unmeasured-tier-credit", &routing.unmeasured_tier_credit,
            "prefix_affinity: what a prompt block in a worker's KV cache tier (host, disk) counts "
            "as, in pool hits, until the worker has measured its load and prefill costs (0: "
            "nothing)");
  f->Bool("no-tier-affinity", &routing.no_tier_credit,
          "prefix_affinity counts only blocks in workers' pools, not in their KV cache tiers");
  f->Int("disagg-min-uncached-tokens", &cluster.disagg_min_uncached_tokens,
         "shorter uncached prompt parts are prefilled on the decode worker");
  f->Int("max-prefills-per-worker", &cluster.max_prefills_per_worker,
         "prefill workers above this many prefills in flight count as saturated");
  f->Double("prefill-timeout", &prefill_timeout_s, "seconds before a prefill is retried elsewhere");
  f->Double("startup-timeout", &startup_timeout_s, "seconds to wait for the first decode worker");
  f->String("model-name", &model_name, "model name clients use (default: the workers')");
  f->String("tls-server-name", &registry.tls_server_name,
            "with --tls-ca: the name every worker's certificate must carry (default: the "
            "address dialed, e.g. a pod IP)");
  f->StringList("lora-modules", &lora_modules,
                "LoRA adapters clients may select by `model`, name=path (a PEFT directory on the "
                "workers' machines; a worker with --enable-lora loads one on demand)");
  f->Bool("allow-runtime-lora-updating", &allow_runtime_lora_updating,
          "allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter without API keys "
          "(with API keys they take an admin key); they load on every worker with LoRA on");
  f->String("cluster-secret-file", &cluster_secret_file,
            "file holding the workers' cluster secret (their --cluster-secret-file): every "
            "call to a worker carries a token of it");
}

RouterRuntime::~RouterRuntime() {
  if (registry_) registry_->Stop();
}

absl::StatusOr<std::unique_ptr<RouterRuntime>> RouterRuntime::Create(const RouterFlags& flags,
                                                                     const std::string& model_dir,
                                                                     RouterHooks* hooks) {
  std::unique_ptr<RouterRuntime> r(new RouterRuntime);
  auto tokenizer = Tokenizer::FromModelDir(model_dir);
  if (!tokenizer.ok()) return tokenizer.status();
  r->tokenizer_ = std::move(tokenizer).value();

  RegistryOptions ro = flags.registry;
  for (auto a : absl::StrSplit(flags.prefill_addresses, ',', absl::SkipEmpty())) {
    ro.prefill_addresses.emplace_back(a);
  }
  for (auto a : absl::StrSplit(flags.decode_addresses, ',', absl::SkipEmpty())) {
    ro.decode_addresses.emplace_back(a);
  }
  ro.hooks = hooks;
  ro.channel_credentials = flags.channel_credentials;
  if (!flags.cluster_secret_file.empty()) {
    auto secret = ReadClusterSecretFile(flags.cluster_secret_file);
    if (!secret.ok()) return secret.status();
    ro.cluster_secret = *std::move(secret);
  }
  if (ro.decode_addresses.empty() && ro.decode_dns.empty()) {
    return absl::InvalidArgumentError("the router needs --decode-addresses or --decode-dns");
  }
  r->registry_ = std::make_unique<WorkerRegistry>(ro);
  r->registry_->Start();

  ClusterOptions co = flags.cluster;
  auto policy = ParseRoutingPolicy(flags.routing_policy);
  if (!policy.ok()) return policy.status();
  co.routing.policy = *policy;
  co.prefill_timeout = absl::Seconds(flags.prefill_timeout_s);
  co.hooks = hooks;
  r->client_ = std::make_unique<ClusterClient>(r->registry_.get(), co);

  if (!r->registry_->WaitForWorkers(0, 1, absl::Seconds(flags.startup_timeout_s))) {
    return absl::UnavailableError("no decode worker registered within the startup timeout");
  }
  GenerationServiceOptions go;
  const auto decoders = r->registry_->Healthy("decode");
  const v1::WorkerInfo& info = decoders.front()->info;
  go.model_name = !flags.model_name.empty() ? flags.model_name
                  : !info.model_name().empty()
                      ? info.model_name()
                      : std::filesystem::path(model_dir).filename().string();
  go.max_model_len = info.max_model_len();
  go.dtype = info.layout().kv_dtype();
  r->generation_ =
      std::make_unique<GenerationService>(go, r->tokenizer_.get(), r->client_.get(), hooks);
  GenerationService* generation = r->generation_.get();
  const bool allow = flags.allow_runtime_lora_updating;
  r->lora_ = std::make_unique<ClusterLoraCatalog>(
      r->registry_.get(), [generation, allow] { return allow || generation->access_control(); });
  if (absl::Status st = r->lora_->AddModules(flags.lora_modules); !st.ok()) return st;
  generation->set_lora_catalog(r->lora_.get());
  // With API keys, runtime LoRA loading takes a key with the admin scope, checked per call (the
  // HTTP API reaches RouterAdmin through an in-process channel the listener's policy never sees).
  auto check_admin = [generation](const grpc::CallbackServerContext& context) {
    AccessControl* access = generation->access_control();
    if (access == nullptr) return grpc::Status::OK;
    auto tenant = access->Authenticate(context.client_metadata(), kScopeAdmin);
    if (tenant.ok()) return grpc::Status::OK;
    return grpc::Status(tenant.status().code() == absl::StatusCode::kPermissionDenied
                            ? grpc::StatusCode::PERMISSION_DENIED
                            : grpc::StatusCode::UNAUTHENTICATED,
                        std::string(tenant.status().message()));
  };
  r->admin_ = std::make_unique<RouterAdminService>(r->registry_.get(), r->client_.get(),
                                                   r->lora_.get(), check_admin);
  TLOG(INFO) << "router: policy " << flags.routing_policy << ", "
             << r->registry_->Healthy("prefill").size() << " prefill and " << decoders.size()
             << " decode workers registered";
  return r;
}

}  // namespace tandem
