#include "common/worker/worker_main.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>

#include "common/base/log.h"
#include "common/cluster/kv_transport_pair.h"
#include "common/cluster/proto/cluster_proto.h"
#include "common/engine/engine_builder.h"
#include "common/metrics/process_metrics.h"
#include "common/metrics/transfer_metrics.h"
#include "common/metrics/worker_metrics.h"
#include "common/rpc/shutdown.h"
#include "common/worker/backend_regions.h"
#include "common/worker/serving_engine.h"
#include "common/worker/worker_service.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/multi_transport.h"

namespace tandem {

WorkerFlags::WorkerFlags() {
  server.port = 50061;
  kv.transport = "auto";  // nccl on a GPU, tcp on the CPU
}

void WorkerFlags::Register(FlagSet* f, bool role_flag) {
  engine.Register(f);
  server.RegisterFlags(f);
  if (role_flag) {
    role = "both";
    f->String("role", &role, "prefill, decode or both");
  }
  f->String("model-name", &model_name, "model name reported to the router");
  f->String("kv-transport", &kv.transport,
            "KV transfer transport: tcp, nccl (GPU memory over NCCL, between GPUs), cuda-ipc "
            "(GPU memory between processes on one GPU) or auto (on a GPU both nccl and "
            "cuda-ipc, the router picking per pair of workers; else tcp); the router refuses "
            "a pair of workers that cannot talk");
  f->String("kv-host", &kv.host, "decode role: address the KV receiver listens on");
  f->Int32("kv-port", &kv.port, "decode role: KV receiver port (0: any free port)");
  f->String("kv-secret-file", &kv_secret_file,
            "file holding the shared secret every KV data connection (tcp) or KV control "
            "message (nccl, cuda-ipc) proves; all workers of a cluster need the same one. "
            "Required, unless --allow-unauthenticated-kv");
  f->Bool("allow-unauthenticated-kv", &allow_unauthenticated_kv,
          "run without --kv-secret-file (tests only): any process that reaches a decode "
          "worker's KV port can then connect to its KV data path, and a prefill worker sends "
          "KV to whatever answers at a decode worker's address");
  f->Int32("kv-max-connections", &kv.limits.max_connections,
           "decode role: KV connections open at once, all peers (tcp: data connections; nccl, "
           "cuda-ipc: control connections)");
  f->Int32("kv-max-connections-per-peer", &kv.limits.max_connections_per_peer,
           "decode role: KV connections open at once from one peer address (tcp: data "
           "connections; nccl, cuda-ipc: control connections)");
  f->Int("kv-memory-budget", &kv.limits.memory_budget,
         "decode role, tcp: bytes the KV data connections' buffers may hold in all (each "
         "authenticated connection holds 320 KiB of it)");
  f->String("cluster-secret-file", &cluster_secret_file,
            "file holding the cluster secret: every Worker API call must prove it (an HMAC "
            "token bound to the method and time, which the router attaches); default: open to "
            "any caller that reaches the port");
  f->Bool("no-layerwise-push", &no_layerwise_push,
          "prefill role: send the KV after the whole prompt instead of layer by layer");
  f->String("kv-zero-copy", &kv_zero_copy,
            "prefill role: auto (the engine writes a cuda-ipc target's KV straight into the "
            "decode worker's blocks on their shared GPU, nothing copied; copying where the "
            "transport cannot) or off (always copy)");
}

absl::StatusOr<bool> ParseKvZeroCopy(const std::string& value) {
  if (value == "auto") return true;
  if (value == "off") return false;
  return absl::InvalidArgumentError("--kv-zero-copy must be auto or off");
}

int RunWorkerProcess(int argc, char** argv, const std::string& command, const std::string& role,
                     const WorkerRoleFactory& make_roles) {
  const sigset_t signals = BlockTerminationSignals();
  WorkerFlags wf;
  wf.role = role;
  FlagSet flags(command, "Runs one worker of a disaggregated cluster (role: " +
                             (role.empty() ? std::string("--role") : role) +
                             "), serving the tandem.v1.Worker gRPC API.");
  wf.Register(&flags, role.empty());
  if (auto exit_code = flags.ParseCommandLine(argc, argv)) return *exit_code;
  if (wf.role != "prefill" && wf.role != "decode" && wf.role != "both") {
    std::fprintf(stderr, "%s: --role must be prefill, decode or both\n", command.c_str());
    return 2;
  }
  WorkerContext context;
  context.flags = &wf;
  if (wf.kv_secret_file.empty() && !wf.allow_unauthenticated_kv) {
    std::fprintf(stderr,
                 "%s: no --kv-secret-file: without it any process that reaches the KV port could "
                 "connect to the KV data path (and a prefill worker would send KV to whatever "
                 "answers at a decode worker's address). Give every worker of the cluster the "
                 "same --kv-secret-file, or --allow-unauthenticated-kv to run without one "
                 "(tests only)\n",
                 command.c_str());
    return 2;
  }
  if (!wf.kv_secret_file.empty()) {
    auto secret = kvtransfer::ReadSecretFile(wf.kv_secret_file);
    if (!secret.ok()) {
      std::fprintf(stderr, "%s: --kv-secret-file: %s\n", command.c_str(),
                   std::string(secret.status().message()).c_str());
      return 2;
    }
    context.kv_secret = *std::move(secret);
  }
  // Every service of the listener but health and reflection takes internal calls only.
  auto policy = std::make_shared<CallPolicy>();
  if (!wf.cluster_secret_file.empty()) {
    auto secret = ReadClusterSecretFile(wf.cluster_secret_file);
    if (!secret.ok()) {
      std::fprintf(stderr, "%s: --cluster-secret-file: %s\n", command.c_str(),
                   std::string(secret.status().message()).c_str());
      return 2;
    }
    context.cluster_secret = *secret;
    policy->fallback = RequireInternalToken(*std::move(secret));
  } else {
    policy->fallback = AllowAll();
  }
  auto options = wf.engine.ToBuildOptions();
  if (!options.ok()) {
    std::fprintf(stderr, "%s: %s\n", command.c_str(),
                 std::string(options.status().message()).c_str());
    return 2;
  }
  // The device and the KV transport are settled before anything loads, so that a worker that
  // cannot run them fails now with one line, not at its first request.
  const std::string requested_transport = wf.kv.transport;
  auto device = ResolveDevice(options->device);
  absl::StatusOr<std::string> transport =
      device.ok() ? kvtransfer::ResolveTransport(wf.kv.transport, *device) : device.status();
  if (!transport.ok()) {
    std::fprintf(stderr, "%s: %s\n", command.c_str(),
                 std::string(transport.status().message()).c_str());
    return 2;
  }
  wf.kv.transport = *transport;
  const bool on_gpu = device->rfind("cuda:", 0) == 0;
  if (on_gpu) context.cuda_device = std::atoi(device->c_str() + 5);
  // Which physical GPU (whatever CUDA_VISIBLE_DEVICES renumbered): cuda-ipc needs one for all.
  const std::string gpu_id = on_gpu ? kvtransfer::GpuId(context.cuda_device) : std::string();
  auto metrics = StartServerProcess(wf.server, wf.role);
  if (!metrics.ok()) {
    TLOG(ERROR) << metrics.status();
    return 1;
  }
#if defined(TANDEM_CUDA_EMULATION)
  TLOG(WARNING) << "GPU EMULATION BUILD (tests only): CUDA (with CUDA IPC) and NCCL are CPU "
                   "emulators (emulated GPU "
                << (std::getenv("TANDEM_EMULATED_GPU") != nullptr
                        ? std::getenv("TANDEM_EMULATED_GPU")
                        : "0")
                << ")";
#endif
  TLOG(INFO) << "KV transport " << wf.kv.transport
             << (requested_transport != wf.kv.transport
                     ? " (--kv-transport " + requested_transport + ")"
                     : std::string())
             << ", engine on " << *device << (gpu_id.empty() ? std::string() : " (" + gpu_id + ")");
  prometheus::Registry* registry = (*metrics)->registry();
  auto serving = StartServingEngine(*options, wf.engine.speculative_method, registry, wf.role);
  if (!serving.ok()) {
    TLOG(ERROR) << serving.status();
    return 1;
  }
  ServingEngine& se = **serving;
  WorkerMetrics worker_metrics(registry, wf.role);
  TransferMetrics transfer_metrics(registry, wf.kv.transport);
  // A worker speaking several transports counts each transfer it sends under the one it took
  // (its receives under all of them: which one a transfer takes is known only once it begins).
  std::map<std::string, std::unique_ptr<TransferMetrics>> metrics_by_transport;
  if (kvtransfer::IsMultiTransport(wf.kv.transport)) {
    for (const std::string& t : SpokenKvTransports(wf.kv.transport)) {
      metrics_by_transport[t] = std::make_unique<TransferMetrics>(registry, t);
    }
    context.transport_hooks = [&metrics_by_transport](const std::string& t) -> TransferHooks* {
      auto it = metrics_by_transport.find(t);
      return it == metrics_by_transport.end() ? nullptr : it->second.get();
    };
  }
  BackendRegions regions(se.backend,
                         /*device_memory=*/kvtransfer::UsesControlChannel(wf.kv.transport));
  context.engine = se.engine.get();
  context.regions = &regions;
  context.layout = LayoutOf(*se.backend, se.model->model_id());
  context.block_size = se.backend->kv_spec().block_size;
  context.transfer_hooks = &transfer_metrics;

  std::vector<std::unique_ptr<WorkerRole>> roles = make_roles(wf.role);
  DecodeHandler* decode = nullptr;
  PrefillHandler* prefill = nullptr;
  for (auto& r : roles) {
    if (absl::Status st = r->Start(context); !st.ok()) {
      TLOG(ERROR) << st;
      return 1;
    }
    if (decode == nullptr) decode = r->decode_handler();
    if (prefill == nullptr) prefill = r->prefill_handler();
  }

  WorkerServiceOptions wo;
  v1::WorkerInfo& info = wo.info;
  info.set_role(wf.role);
  *info.mutable_layout() = KvLayoutToInfo(context.layout);
  info.set_kv_transport(wf.kv.transport);
  info.set_kv_device(gpu_id);
  for (const auto& r : roles) r->Describe(&info);
  info.set_model_name(!wf.model_name.empty()
                          ? wf.model_name
                          : std::filesystem::path(options->model_dir).filename().string());
  info.set_max_model_len(static_cast<int32_t>(se.max_model_len));
  info.set_vocab_size(static_cast<int32_t>(se.model->config().vocab_size));
  WorkerService service(wo, se.engine.get(), &se.events, decode, prefill, &worker_metrics);

  auto server = StartGrpcServer(wf.server, {&service}, std::move(policy));
  if (!server.ok()) {
    TLOG(ERROR) << server.status();
    return 1;
  }
  if (wf.kv_secret_file.empty()) {
    TLOG(WARNING) << "--allow-unauthenticated-kv: the KV data path is not authenticated: any "
                     "process that reaches "
                  << (info.kv_endpoint().empty() ? std::string("a decode worker's KV port")
                                                 : "the KV port " + info.kv_endpoint())
                  << " can connect to it, and this worker's transfers trust whatever answers "
                     "at a decode worker's address; set --kv-secret-file outside a test";
  }
  if (wf.cluster_secret_file.empty() && !wf.server.tls.client_auth) {
    TLOG(WARNING) << "the Worker API takes calls from anyone who reaches " << wf.server.host << ":"
                  << server->port
                  << ": set --cluster-secret-file (or --tls-client-auth) outside a test";
  }
  TLOG(INFO) << wf.role << " worker serving on " << wf.server.host << ":" << server->port
             << (!info.kv_endpoint().empty() ? " (KV endpoint " + info.kv_endpoint() + ")" : "");
  DrainOnSignal(
      signals, server->server.get(), absl::Seconds(wf.server.drain_timeout_s),
      [&] { return service.active_calls(); }, [&] { service.StartDrain(); });
  service.Stop();
  se.engine->Shutdown();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  TLOG(INFO) << "stopped";
  return 0;
}

}  // namespace tandem
