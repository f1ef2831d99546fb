// `tandem serve` and `tandem worker`: the commands that put several roles into one deployment.

#include "serve/serve_main.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/engine_builder.h"
#include "common/rpc/shutdown.h"
#include "decode_worker/decode_main.h"
#include "kvtransfer/transport.h"
#include "prefill_worker/prefill_main.h"
#include "serve/serve_modes.h"

namespace tandem {

int RunServe(int argc, char** argv) {
  const sigset_t signals = BlockTerminationSignals();
  ServeFlags sf;
  sf.server.port = 50051;
  FlagSet flags("serve",
                "Serves the Generation gRPC API: the router and one worker in this process, or\n"
                "with --prefill-workers/--decode-workers a local disaggregated cluster.");
  sf.engine.Register(&flags);
  sf.server.RegisterFlags(&flags);
  sf.http.Register(&flags);
  sf.keys.Register(&flags);
  flags.String("model-name", &sf.model_name, "name clients use (default: the directory's name)");
  flags.Int("prefill-workers", &sf.prefill_workers, "prefill worker processes (cluster mode)");
  flags.Int("decode-workers", &sf.decode_workers, "decode worker processes (cluster mode)");
  flags.String("routing-policy", &sf.router.routing_policy,
               "cluster mode: round_robin, least_loaded or prefix_affinity");
  flags.Int("disagg-min-uncached-tokens", &sf.router.cluster.disagg_min_uncached_tokens,
            "cluster mode: shorter uncached prompt parts are prefilled on the decode worker");
  flags.Int("max-prefills-per-worker", &sf.router.cluster.max_prefills_per_worker,
            "cluster mode: prefill workers above this many prefills in flight are saturated");
  flags.Bool("no-tier-affinity", &sf.router.cluster.routing.no_tier_credit,
             "cluster mode: prefix affinity counts only blocks in workers' pools, not in their KV "
             "cache tiers (for comparisons)");
  flags.Bool("no-layerwise-push", &sf.no_layerwise_push,
             "cluster mode: prefill workers send the KV after the prompt, not layer by layer");
  flags.String("kv-zero-copy", &sf.kv_zero_copy,
               "cluster mode: the prefill workers' --kv-zero-copy, auto (default: on one GPU the "
               "prefill engine writes the KV straight into the decode worker's blocks) or off");
  flags.Double("prefill-timeout", &sf.router.prefill_timeout_s,
               "cluster mode: seconds before a prefill is retried elsewhere");
  flags.String("kv-secret-file", &sf.kv_secret_file,
               "cluster mode: file holding the shared secret the workers' KV data path "
               "authenticates with (HMAC handshake per connection; default: a fresh secret per "
               "cluster)");
  flags.String("kv-transport", &sf.kv_transport,
               "cluster mode: the workers' KV transport: tcp, nccl, cuda-ipc or auto (cuda-ipc "
               "when the engine runs on a GPU, which all workers share, else tcp)");
  flags.String("cluster-secret-file", &sf.cluster_secret_file,
               "cluster mode: file holding the secret every call to a worker proves (default: "
               "a fresh secret per cluster)");
  flags.Bool("allow-runtime-lora-updating", &sf.allow_runtime_lora_updating,
             "allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter without API keys "
             "(vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING; with API keys they take an admin key)");
  if (auto exit_code = flags.ParseCommandLine(argc, argv)) return *exit_code;
  const bool cluster = sf.prefill_workers > 0 || sf.decode_workers > 0;
  if (!cluster && sf.kv_transport != ServeFlags().kv_transport) {
    std::fprintf(stderr, "serve: --kv-transport needs cluster mode (--decode-workers)\n");
    return 2;
  }
  std::string transport_note;
  if (cluster) {
    // Settled before any worker starts, so a transport this machine cannot run fails now with
    // one line (each worker checks again for itself).
    auto options = sf.engine.ToBuildOptions();
    auto device = options.ok() ? ResolveDevice(options->device) : options.status();
    // Every worker runs its engine on this one device, so `auto` on a GPU is cuda-ipc.
    auto transport = device.ok() ? kvtransfer::ResolveSharedGpuTransport(sf.kv_transport, *device)
                                 : device.status();
    if (!transport.ok()) {
      std::fprintf(stderr, "serve: %s\n", std::string(transport.status().message()).c_str());
      return 2;
    }
#if !defined(TANDEM_CUDA_EMULATION)
    if (*transport == "nccl" && device->rfind("cuda", 0) == 0) {
      std::fprintf(stderr,
                   "serve: --kv-transport nccl: every worker runs on %s and NCCL refuses two "
                   "ranks on one GPU: use cuda-ipc or auto (or start `tandem prefill` and "
                   "`tandem decode` workers on separate GPUs)\n",
                   device->c_str());
      return 2;
    }
#endif
    if (*transport != sf.kv_transport) {
      transport_note = absl::StrCat("KV transport ", *transport, " (--kv-transport ",
                                    sf.kv_transport, ": every worker on ", *device, ")");
    }
    sf.kv_transport = *transport;
  }
  auto metrics = StartServerProcess(sf.server, "serve");
  if (!metrics.ok()) {
    TLOG(ERROR) << metrics.status();
    return 1;
  }
  if (!transport_note.empty()) {
    TLOG(INFO) << transport_note;  // logging is configured now
  }
  sf.router.model_name = sf.model_name;
  if (sf.prefill_workers > 0 || sf.decode_workers > 0) {
    if (sf.decode_workers < 1) {
      std::fprintf(stderr, "serve: a cluster needs --decode-workers >= 1\n");
      return 2;
    }
    return ServeCluster(signals, sf, metrics->get());
  }
  if (!sf.kv_secret_file.empty()) {
    std::fprintf(stderr, "serve: --kv-secret-file needs cluster mode (--decode-workers)\n");
    return 2;
  }
  if (!sf.cluster_secret_file.empty()) {
    std::fprintf(stderr,
                 "serve: --cluster-secret-file needs cluster mode (--decode-workers): "
                 "one process offers no Worker API\n");
    return 2;
  }
  return ServeMonolithic(signals, sf, metrics->get());
}

int RunWorker(int argc, char** argv) {
  return RunWorkerProcess(argc, argv, "worker", "", [](const std::string& role) {
    std::vector<std::unique_ptr<WorkerRole>> roles;
    if (role == "decode" || role == "both") roles.push_back(std::make_unique<DecodeRole>());
    if (role == "prefill" || role == "both") roles.push_back(std::make_unique<PrefillRole>());
    return roles;
  });
}

}  // namespace tandem
