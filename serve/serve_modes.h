#pragma once

#include <csignal>
#include <string>

#include "common/metrics/process_metrics.h"
#include "common/rpc/server.h"
#include "common/worker/engine_flags.h"
#include "router/http_api.h"
#include "router/router_runtime.h"

namespace tandem {

// The flags of `tandem serve` (serve_main.cc registers them).
struct ServeFlags {
  EngineFlags engine;
  ServerOptions server;  // --port: 50051
  HttpFlags http;
  ApiKeyFlags keys;
  RouterFlags router;  // cluster mode: the router's placement flags
  std::string model_name;
  int64_t prefill_workers = 0;
  int64_t decode_workers = 0;
  bool no_layerwise_push = false;
  // Cluster mode: the prefill workers' --kv-zero-copy (empty: theirs, auto).
  std::string kv_zero_copy;
  // Cluster mode: the secret the workers' KV data path proves; empty: a fresh one per cluster
  // (as the cluster secret's).
  std::string kv_secret_file;
  // Cluster mode: the secret the router proves on every call to its workers; empty: a fresh
  // one per cluster (a file only this user can read in the supervisor's state directory).
  std::string cluster_secret_file;
  std::string kv_transport = "auto";  // cluster mode: the workers' --kv-transport
  // Runtime LoRA loading (/v1/load_lora_adapter) without API keys (vLLM's
  // VLLM_ALLOW_RUNTIME_LORA_UPDATING); with API keys an admin key is enough.
  bool allow_runtime_lora_updating = false;
};

// The router and one worker (role both) in this process (monolithic.cc).
int ServeMonolithic(const sigset_t& signals, const ServeFlags& flags, ProcessMetrics* metrics);
// The router in this process, the workers as child processes on loopback (local_cluster.cc).
int ServeCluster(const sigset_t& signals, ServeFlags flags, ProcessMetrics* metrics);

}  // namespace tandem
