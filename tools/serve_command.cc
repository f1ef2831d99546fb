// `tandem serve`: the router front and the workers. By default one process holds the router and
// one worker in role `both`; with --prefill-workers N --decode-workers M it runs a local
// disaggregated cluster: N + M worker processes on loopback and the router in this process.

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/log.h"
#include "common/engine/async_engine.h"
#include "common/metrics/engine_metrics.h"
#include "common/metrics/process_metrics.h"
#include "common/metrics/router_metrics.h"
#include "common/metrics/spec_metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "common/worker/kv_event_log.h"
#include "common/worker/worker_service.h"
#include "decode_worker/decode_core.h"
#include "kvtransfer/auth.h"
#include "router/generation_service.h"
#include "tools/cluster_supervisor.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/http_api.h"
#include "tools/router_runtime.h"

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

// Waits for the signal, then drains: new requests get UNAVAILABLE, running ones finish.
void DrainOnSignal(const sigset_t& signals, const ServerFlags& server_flags, grpc::Server* server,
                   const std::function<int64_t()>& active,
                   const std::function<void()>& start_drain) {
  const int sig = WaitForTerminationSignal(signals);
  TLOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining " << active()
             << " streams";
  start_drain();
  server->GetHealthCheckService()->SetServingStatus(false);
  const absl::Time deadline = absl::Now() + absl::Seconds(server_flags.drain_timeout_s);
  while (active() > 0 && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (active() > 0) {
    TLOG(WARNING) << "drain timeout: aborting " << active() << " streams";
  }
}

int ServeMonolithic(const sigset_t& signals, const EngineFlags& engine_flags,
                    const ServerFlags& server_flags, const HttpFlags& http_flags,
                    const ApiKeyFlags& key_flags, const std::string& model_name,
                    ProcessMetrics* metrics) {
  auto tokenizer = Tokenizer::FromModelDir(engine_flags.model_dir);
  if (!tokenizer.ok()) {
    TLOG(ERROR) << tokenizer.status();
    return 1;
  }
  auto options = engine_flags.ToBuildOptions();
  if (!options.ok()) {
    TLOG(ERROR) << options.status();
    return 2;
  }
  auto built = BuildEngine(*options);
  if (!built.ok()) {
    TLOG(ERROR) << built.status();
    return 1;
  }
  KvEventLog events;
  built->engine->block_pool().set_listener({[&events](BlockHash h) { events.Stored(h); },
                                            [&events](BlockHash h) { events.Removed(h); }});
  const ModelConfig& config = built->model->config();
  const int64_t context = built->engine->max_model_len();
  EngineMetrics engine_metrics(metrics->registry(), "both");
  RouterMetrics router_metrics(metrics->registry());
  std::optional<SpecMetrics> spec_metrics;  // only when speculating: no empty series otherwise
  if (engine_flags.speculative_method != "none") {
    spec_metrics.emplace(metrics->registry(), engine_flags.speculative_method);
    built->engine->set_spec_hooks(&*spec_metrics);
  }
  AsyncEngine engine(std::move(built->engine), &engine_metrics);
  DecodeCore core(&engine);
  LocalClient client(&core);

  GenerationServiceOptions service_options;
  service_options.model_name =
      !model_name.empty() ? model_name
                          : std::filesystem::path(engine_flags.model_dir).filename().string();
  if (service_options.model_name.empty()) service_options.model_name = "default";
  service_options.architecture = config.architecture_name;
  service_options.max_model_len = static_cast<int32_t>(context);
  service_options.dtype = std::string(DTypeName(built->model->weight_dtype()));
  GenerationService service(service_options, tokenizer->get(), &client, &router_metrics);
  auto keys = ApiKeys::Start(key_flags, &service);
  if (!keys.ok()) {
    TLOG(ERROR) << keys.status();
    return 1;
  }
  WorkerServiceOptions worker_options;
  worker_options.info.set_role("both");
  worker_options.info.set_model_name(service_options.model_name);
  worker_options.info.set_max_model_len(static_cast<int32_t>(context));
  worker_options.info.set_vocab_size(static_cast<int32_t>(config.vocab_size));
  WorkerService worker_service(worker_options, &engine, &events, &core, nullptr);

  auto server = StartGrpcServer(server_flags, {&service, &worker_service});
  if (!server.ok()) {
    TLOG(ERROR) << server.status();
    return 1;
  }
  TLOG(INFO) << "serving model '" << service_options.model_name << "' on " << server_flags.host
             << ":" << server->port;
  auto http = HttpApi::Start(http_flags, server_flags, server->server.get(), tokenizer->get(),
                             service_options.model_name, service_options.max_model_len);
  if (!http.ok()) {
    TLOG(ERROR) << http.status();
    return 1;
  }
  DrainOnSignal(
      signals, server_flags, server->server.get(),
      [&] { return service.active_calls() + worker_service.active_calls(); },
      [&] {
        service.StartDrain();
        worker_service.StartDrain();
      });
  if (*http != nullptr) (*http)->Stop();
  worker_service.Stop();
  engine.Shutdown();  // aborts whatever is left; their streams end
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  TLOG(INFO) << "stopped";
  return 0;
}

int ServeCluster(const sigset_t& signals, const EngineFlags& engine_flags,
                 const ServerFlags& server_flags, const HttpFlags& http_flags,
                 const ApiKeyFlags& key_flags, RouterFlags router_flags, int64_t prefill_workers,
                 int64_t decode_workers, bool layerwise_push, const std::string& kv_secret_file,
                 ProcessMetrics* metrics) {
  ClusterSupervisorOptions supervisor_options;
  supervisor_options.state_dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("tandem-serve-", getpid())).string();
  std::filesystem::create_directories(supervisor_options.state_dir);
  // With /metrics on, every worker serves its own on a free port.
  supervisor_options.metrics = metrics->port() != 0;
  supervisor_options.metrics_host = server_flags.metrics.host;
  ClusterSupervisor supervisor(supervisor_options);
  std::vector<std::string> args = engine_flags.ToArgs();
  if (server_flags.log_json) args.push_back("--log-json");
  // The workers serve with the same certificate; the router dials them with it (mTLS).
  for (std::string& a : server_flags.TlsArgs()) args.push_back(std::move(a));
  // The KV data path between them authenticates with the shared secret (the path, not the
  // secret, goes on their command lines).
  if (!kv_secret_file.empty()) {
    if (auto secret = kvtransfer::ReadSecretFile(kv_secret_file); !secret.ok()) {
      TLOG(ERROR) << "--kv-secret-file: " << secret.status();
      return 2;
    }
    args.push_back("--kv-secret-file=" + kv_secret_file);
  }
  auto credentials = MakeChannelCredentials(server_flags);
  if (!credentials.ok()) {
    TLOG(ERROR) << credentials.status();
    return 2;
  }
  router_flags.channel_credentials = *credentials;
  std::vector<std::string> prefill_args = args;
  if (!layerwise_push) prefill_args.push_back("--no-layerwise-push");
  if (auto st = supervisor.Launch("prefill", static_cast<int>(prefill_workers), prefill_args,
                                  absl::Seconds(120));
      !st.ok()) {
    TLOG(ERROR) << st;
    return 1;
  }
  if (auto st =
          supervisor.Launch("decode", static_cast<int>(decode_workers), args, absl::Seconds(120));
      !st.ok()) {
    TLOG(ERROR) << st;
    return 1;
  }
  supervisor.StartMonitor();
  if (supervisor_options.metrics && !server_flags.metrics.port_file.empty()) {
    // Scrape targets of the workers, next to this process's own metrics port file.
    WriteFileAtomically(server_flags.metrics.port_file + ".workers", supervisor.MetricsTargets());
  }
  router_flags.prefill_addresses = absl::StrJoin(supervisor.Addresses("prefill"), ",");
  router_flags.decode_addresses = absl::StrJoin(supervisor.Addresses("decode"), ",");
  RouterMetrics router_metrics(metrics->registry());
  auto router = RouterRuntime::Create(router_flags, engine_flags.model_dir, &router_metrics);
  if (!router.ok()) {
    TLOG(ERROR) << router.status();
    return 1;
  }
  auto keys = ApiKeys::Start(key_flags, &(*router)->generation());
  if (!keys.ok()) {
    TLOG(ERROR) << keys.status();
    return 1;
  }
  (*router)->registry().WaitForWorkers(static_cast<int>(prefill_workers),
                                       static_cast<int>(decode_workers), absl::Seconds(60));
  auto server = StartGrpcServer(server_flags, (*router)->services());
  if (!server.ok()) {
    TLOG(ERROR) << server.status();
    return 1;
  }
  TLOG(INFO) << "cluster of " << prefill_workers << " prefill and " << decode_workers
             << " decode workers serving on " << server_flags.host << ":" << server->port;
  auto http = HttpApi::Start(http_flags, server_flags, server->server.get(),
                             &(*router)->tokenizer(), (*router)->generation().options().model_name,
                             (*router)->generation().options().max_model_len);
  if (!http.ok()) {
    TLOG(ERROR) << http.status();
    return 1;
  }
  DrainOnSignal(
      signals, server_flags, server->server.get(),
      [&] { return (*router)->generation().active_calls(); },
      [&] { (*router)->generation().StartDrain(); });
  if (*http != nullptr) (*http)->Stop();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  (*router)->Stop();
  supervisor.Stop(absl::Seconds(30));
  std::filesystem::remove_all(supervisor_options.state_dir);
  TLOG(INFO) << "stopped";
  return 0;
}

}  // namespace

int RunServe(int argc, char** argv) {
  const sigset_t signals = BlockTerminationSignals();
  EngineFlags engine_flags;
  ServerFlags server_flags;
  RouterFlags router_flags;
  HttpFlags http_flags;
  ApiKeyFlags key_flags;
  std::string model_name, kv_secret_file;
  int64_t prefill_workers = 0, decode_workers = 0;
  bool no_layerwise_push = false;
  FlagSet flags("serve",
                "Serves the Generation gRPC API: the router and one worker in this process, or\n"
                "with --prefill-workers/--decode-workers a local disaggregated cluster.");
  engine_flags.Register(&flags);
  server_flags.Register(&flags, 50051);
  http_flags.Register(&flags);
  key_flags.Register(&flags);
  flags.String("model-name", &model_name, "name clients use (default: the directory's name)");
  flags.Int("prefill-workers", &prefill_workers, "prefill worker processes (cluster mode)");
  flags.Int("decode-workers", &decode_workers, "decode worker processes (cluster mode)");
  flags.String("routing-policy", &router_flags.routing_policy,
               "cluster mode: round_robin, least_loaded or prefix_affinity");
  flags.Int("disagg-min-uncached-tokens", &router_flags.disagg_min_uncached_tokens,
            "cluster mode: shorter uncached prompt parts are prefilled on the decode worker");
  flags.Int("max-prefills-per-worker", &router_flags.max_prefills_per_worker,
            "cluster mode: prefill workers above this many prefills in flight are saturated");
  flags.Bool("no-layerwise-push", &no_layerwise_push,
             "cluster mode: prefill workers send the KV after the prompt, not layer by layer");
  flags.Double("prefill-timeout", &router_flags.prefill_timeout_s,
               "cluster mode: seconds before a prefill is retried elsewhere");
  flags.String("kv-secret-file", &kv_secret_file,
               "cluster mode: file holding the shared secret the workers' KV data path "
               "authenticates with (HMAC handshake per connection)");
  if (auto st = flags.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) return 0;
  ConfigureLogging({LogLevel::kInfo, server_flags.log_json, "serve"});
  auto metrics = ProcessMetrics::Start(server_flags.Metrics(), "serve", server_flags.host);
  if (!metrics.ok()) {
    TLOG(ERROR) << metrics.status();
    return 1;
  }
  router_flags.model_name = model_name;
  if (prefill_workers > 0 || decode_workers > 0) {
    if (decode_workers < 1) {
      std::fprintf(stderr, "serve: a cluster needs --decode-workers >= 1\n");
      return 2;
    }
    return ServeCluster(signals, engine_flags, server_flags, http_flags, key_flags, router_flags,
                        prefill_workers, decode_workers, !no_layerwise_push, kv_secret_file,
                        metrics->get());
  }
  if (!kv_secret_file.empty()) {
    std::fprintf(stderr, "serve: --kv-secret-file needs cluster mode (--decode-workers)\n");
    return 2;
  }
  return ServeMonolithic(signals, engine_flags, server_flags, http_flags, key_flags, model_name,
                         metrics->get());
}

}  // namespace tandem
