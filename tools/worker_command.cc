// `tandem prefill`, `tandem decode` and `tandem worker --role=...`: one worker process of a
// disaggregated cluster, serving the tandem.v1.Worker API.

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/async_engine.h"
#include "common/metrics/engine_metrics.h"
#include "common/metrics/process_metrics.h"
#include "common/metrics/spec_metrics.h"
#include "common/metrics/transfer_metrics.h"
#include "common/metrics/worker_metrics.h"
#include "common/worker/backend_regions.h"
#include "common/worker/kv_event_log.h"
#include "common/worker/worker_service.h"
#include "decode_worker/decode_core.h"
#include "kvtransfer/auth.h"
#include "prefill_worker/prefill_core.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace tandem {
namespace {

int RunWorkerWithRole(int argc, char** argv, const std::string& command, std::string role) {
  const sigset_t signals = BlockTerminationSignals();
  EngineFlags engine_flags;
  ServerFlags server_flags;
  std::string model_name, kv_transport = "tcp", kv_host = "127.0.0.1", kv_secret_file;
  int64_t kv_port = 0;
  bool no_layerwise_push = false;
  FlagSet flags(command, "Runs one worker of a disaggregated cluster (role: " +
                             (role.empty() ? std::string("--role") : role) +
                             "), serving the tandem.v1.Worker gRPC API.");
  engine_flags.Register(&flags);
  server_flags.Register(&flags, 50061);
  if (role.empty()) {
    role = "both";
    flags.String("role", &role, "prefill, decode or both");
  }
  flags.String("model-name", &model_name, "model name reported to the router");
  flags.String("kv-transport", &kv_transport, "KV transfer transport: tcp (or loopback in tests)");
  flags.String("kv-host", &kv_host, "decode role: address the KV receiver listens on");
  flags.Int("kv-port", &kv_port, "decode role: KV receiver port (0: any free port)");
  flags.String("kv-secret-file", &kv_secret_file,
               "file holding the shared secret every KV data connection proves (tcp; all "
               "workers of a cluster need the same one)");
  flags.Bool("no-layerwise-push", &no_layerwise_push,
             "prefill role: send the KV after the whole prompt instead of layer by layer");
  if (auto st = flags.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) return 0;
  if (role != "prefill" && role != "decode" && role != "both") {
    std::fprintf(stderr, "%s: --role must be prefill, decode or both\n", command.c_str());
    return 2;
  }
  ConfigureLogging({LogLevel::kInfo, server_flags.log_json, role});
  std::string kv_secret;
  if (!kv_secret_file.empty()) {
    auto secret = kvtransfer::ReadSecretFile(kv_secret_file);
    if (!secret.ok()) {
      std::fprintf(stderr, "%s: --kv-secret-file: %s\n", command.c_str(),
                   std::string(secret.status().message()).c_str());
      return 2;
    }
    kv_secret = *std::move(secret);
  }
  auto metrics = ProcessMetrics::Start(server_flags.Metrics(), role, server_flags.host);
  if (!metrics.ok()) {
    TLOG(ERROR) << metrics.status();
    return 1;
  }
  prometheus::Registry* registry = (*metrics)->registry();
  EngineMetrics engine_metrics(registry, role);
  WorkerMetrics worker_metrics(registry, role);
  TransferMetrics transfer_metrics(registry, kv_transport);
  auto options = engine_flags.ToBuildOptions();
  if (!options.ok()) {
    std::fprintf(stderr, "%s: %s\n", command.c_str(),
                 std::string(options.status().message()).c_str());
    return 2;
  }
  auto built = BuildEngine(*options);
  std::optional<SpecMetrics> spec_metrics;  // only when speculating: no empty series otherwise
  if (built.ok() && engine_flags.speculative_method != "none") {
    spec_metrics.emplace(registry, engine_flags.speculative_method);
    built->engine->set_spec_hooks(&*spec_metrics);
  }
  if (!built.ok()) {
    TLOG(ERROR) << built.status();
    return 1;
  }
  std::shared_ptr<const Model> model = built->model;
  Backend* backend = &built->engine->backend();
  KvEventLog events;
  built->engine->block_pool().set_listener({[&events](BlockHash h) { events.Stored(h); },
                                            [&events](BlockHash h) { events.Removed(h); }});
  const int64_t max_model_len = built->engine->max_model_len();
  AsyncEngine engine(std::move(built->engine), &engine_metrics);
  BackendRegions regions(backend);
  const kvtransfer::KvLayout layout = LayoutOf(*backend, model->model_id());

  std::unique_ptr<DecodeCore> decode;
  std::unique_ptr<PrefillCore> prefill;
  if (role == "decode" || role == "both") {
    decode = std::make_unique<DecodeCore>(&engine);
    kvtransfer::ReceiverOptions ro;
    ro.transport = kv_transport;
    ro.host = kv_host;
    ro.port = static_cast<int>(kv_port);
    ro.layout = layout;
    ro.secret = kv_secret;
    ro.hooks = &transfer_metrics;
    if (auto st = decode->StartReceiver(ro, &regions); !st.ok()) {
      TLOG(ERROR) << "KV receiver: " << st;
      return 1;
    }
  }
  if (role == "prefill" || role == "both") {
    prefill =
        std::make_unique<PrefillCore>(&engine, backend->kv_spec().block_size, !no_layerwise_push);
    kvtransfer::SenderOptions so;
    so.transport = kv_transport;
    so.layout = layout;
    so.secret = kv_secret;
    so.hooks = &transfer_metrics;
    if (auto st = prefill->StartSender(so, &regions); !st.ok()) {
      TLOG(ERROR) << "KV sender: " << st;
      return 1;
    }
  }

  WorkerServiceOptions wo;
  v1::WorkerInfo& info = wo.info;
  info.set_role(role);
  v1::KvLayoutInfo* li = info.mutable_layout();
  li->set_model_id(layout.model_id);
  li->set_num_layers(layout.num_layers);
  li->set_num_kv_heads(layout.num_kv_heads);
  li->set_head_dim(layout.head_dim);
  li->set_block_size(layout.block_size);
  li->set_kv_dtype(std::string(DTypeName(layout.kv_dtype)));
  li->set_protocol_version(layout.protocol_version);
  info.set_kv_transport(kv_transport);
  if (decode) {
    info.set_kv_endpoint(decode->kv_endpoint());
    info.set_incarnation(decode->incarnation());
  }
  info.set_model_name(!model_name.empty()
                          ? model_name
                          : std::filesystem::path(engine_flags.model_dir).filename().string());
  info.set_max_model_len(static_cast<int32_t>(max_model_len));
  info.set_vocab_size(static_cast<int32_t>(model->config().vocab_size));
  WorkerService service(wo, &engine, &events, decode.get(), prefill.get(), &worker_metrics);

  auto server = StartGrpcServer(server_flags, {&service});
  if (!server.ok()) {
    TLOG(ERROR) << server.status();
    return 1;
  }
  TLOG(INFO) << role << " worker serving on " << server_flags.host << ":" << server->port
             << (decode ? " (KV endpoint " + decode->kv_endpoint() + ")" : "");

  const int sig = WaitForTerminationSignal(signals);
  TLOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining";
  service.StartDrain();
  server->server->GetHealthCheckService()->SetServingStatus(false);
  const absl::Time deadline = absl::Now() + absl::Seconds(server_flags.drain_timeout_s);
  while (service.active_calls() > 0 && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  service.Stop();
  engine.Shutdown();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  TLOG(INFO) << "stopped";
  return 0;
}

}  // namespace

int RunWorker(int argc, char** argv) { return RunWorkerWithRole(argc, argv, "worker", ""); }
int RunPrefillWorker(int argc, char** argv) {
  return RunWorkerWithRole(argc, argv, "prefill", "prefill");
}
int RunDecodeWorker(int argc, char** argv) {
  return RunWorkerWithRole(argc, argv, "decode", "decode");
}

}  // namespace tandem
