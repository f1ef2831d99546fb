// `tandem serve` without worker counts: the router front and one worker (role both) in this
// process, the front calling the decode core directly. The public port offers the Generation
// API and RouterAdmin (the worker's load), never the Worker API: nothing reaches the engine
// but through the Generation API's keys, tenant limits and cache salts.

#include <filesystem>

#include "common/base/log.h"
#include "common/engine/lora/lora_registry.h"
#include "common/metrics/router_metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "common/worker/serving_engine.h"
#include "common/worker/worker_service.h"
#include "decode_worker/decode_core.h"
#include "router/generation_front.h"
#include "router/generation_service.h"
#include "serve/local_admin.h"
#include "serve/serve_modes.h"

namespace tandem {
namespace {

// Routes the router's requests to the decode core in this process.
class LocalClient : public InferenceClient {
 public:
  explicit LocalClient(DecodeCore* core) : core_(core) {}
  void Decode(const v1::DecodeRequest& request, ResponseCallback callback) override {
    core_->Decode(request, std::move(callback));
  }
  void Cancel(const std::string& request_id, int32_t index) override {
    core_->Cancel(request_id, index);
  }

 private:
  DecodeCore* core_;
};

// The engine's LoRA registry as the router front sees it. Runtime loading is allowed when
// `allowed()` says so (API keys on, whose admin scope RouterAdmin's policy checks, or
// --allow-runtime-lora-updating).
class RegistryCatalog : public LoraCatalog {
 public:
  RegistryCatalog(std::shared_ptr<LoraRegistry> registry, std::function<bool()> allowed)
      : registry_(std::move(registry)), allowed_(std::move(allowed)) {}
  std::vector<Entry> List() const override {
    std::vector<Entry> out;
    for (const LoraInfo& info : registry_->List()) out.push_back({info.name, info.path});
    return out;
  }
  bool Has(const std::string& name) const override { return registry_->Find(name) != nullptr; }
  absl::Status Load(const std::string& name, const std::string& path) override {
    if (!allowed_()) return NotAllowed();
    absl::Status st = registry_->Load(name, path);
    TLOG(INFO) << "load LoRA adapter '" << name << "' from " << path << ": " << st;
    return st;
  }
  absl::StatusOr<int64_t> Unload(const std::string& name) override {
    if (!allowed_()) return NotAllowed();
    auto in_use = registry_->Unload(name);
    TLOG(INFO) << "unload LoRA adapter '" << name << "': " << in_use.status();
    return in_use;
  }

 private:
  static absl::Status NotAllowed() {
    return absl::FailedPreconditionError(
        "runtime LoRA loading is off: serve with API keys (then an admin key loads) or with "
        "--allow-runtime-lora-updating");
  }
  std::shared_ptr<LoraRegistry> registry_;
  std::function<bool()> allowed_;
};

}  // namespace

int ServeMonolithic(const sigset_t& signals, const ServeFlags& flags, ProcessMetrics* metrics) {
  auto tokenizer = Tokenizer::FromModelDir(flags.engine.options.model_dir);
  if (!tokenizer.ok()) {
    TLOG(ERROR) << tokenizer.status();
    return 1;
  }
  auto options = flags.engine.ToBuildOptions();
  if (!options.ok()) {
    TLOG(ERROR) << options.status();
    return 2;
  }
  auto serving =
      StartServingEngine(*options, flags.engine.speculative_method, metrics->registry(), "both");
  if (!serving.ok()) {
    TLOG(ERROR) << serving.status();
    return 1;
  }
  ServingEngine& se = **serving;
  RouterMetrics router_metrics(metrics->registry());
  DecodeCore core(se.engine.get());
  LocalClient client(&core);

  GenerationServiceOptions service_options;
  service_options.model_name = !flags.model_name.empty()
                                   ? flags.model_name
                                   : std::filesystem::path(options->model_dir).filename().string();
  if (service_options.model_name.empty()) service_options.model_name = "default";
  service_options.architecture = se.model->config().architecture_name;
  service_options.max_model_len = static_cast<int32_t>(se.max_model_len);
  service_options.dtype = std::string(DTypeName(se.model->weight_dtype()));
  GenerationService service(service_options, tokenizer->get(), &client, &router_metrics);
  AsyncEngine* engine = se.engine.get();
  std::unique_ptr<RegistryCatalog> lora;
  if (const std::shared_ptr<LoraRegistry>& registry = engine->engine().lora_registry()) {
    const bool flag = flags.allow_runtime_lora_updating;
    lora = std::make_unique<RegistryCatalog>(
        registry, [&service, flag] { return flag || service.access_control() != nullptr; });
    service.set_lora_catalog(lora.get());
  }
  // With API keys, runtime LoRA loading takes a key with the admin scope, checked per call (the
  // HTTP API reaches RouterAdmin through an in-process channel the listener's policy never sees).
  auto check_admin = [&service](const grpc::CallbackServerContext& context) {
    AccessControl* access = service.access_control();
    if (access == nullptr) return grpc::Status::OK;
    auto tenant = access->Authenticate(context.client_metadata(), kScopeAdmin);
    if (tenant.ok()) return grpc::Status::OK;
    return grpc::Status(tenant.status().code() == absl::StatusCode::kPermissionDenied
                            ? grpc::StatusCode::PERMISSION_DENIED
                            : grpc::StatusCode::UNAUTHENTICATED,
                        std::string(tenant.status().message()));
  };
  LocalAdminService admin([engine] { return ToWorkerStats(engine->stats()); }, lora.get(),
                          check_admin);

  auto front =
      GenerationFront::Start(flags.server, flags.http, flags.keys, &service, tokenizer->get(),
                             {&service, &admin}, "model '" + service_options.model_name + "'");
  if (!front.ok()) {
    TLOG(ERROR) << front.status();
    return 1;
  }
  (*front)->DrainOnSignal(
      signals, [&] { return service.active_calls(); }, [&] { service.StartDrain(); });
  se.engine->Shutdown();  // aborts whatever is left; their streams end
  (*front)->Shutdown();
  TLOG(INFO) << "stopped";
  return 0;
}

}  // namespace tandem
