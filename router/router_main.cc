#include "router/router_main.h"

#include "common/base/log.h"
#include "common/config/default_model.h"
#include "common/metrics/process_metrics.h"
#include "common/metrics/router_metrics.h"
#include "common/rpc/server.h"
#include "common/rpc/shutdown.h"
#include "router/generation_front.h"
#include "router/http_api.h"
#include "router/router_runtime.h"

namespace tandem {

int ServeRouterUntilSignal(RouterRuntime* router, const sigset_t& signals,
                           const ServerOptions& server, const HttpFlags& http,
                           const ApiKeyFlags& keys, const std::string& label) {
  GenerationService& generation = router->generation();
  auto front = GenerationFront::Start(server, http, keys, &generation, &router->tokenizer(),
                                      router->services(), label);
  if (!front.ok()) {
    TLOG(ERROR) << front.status();
    return 1;
  }
  (*front)->DrainOnSignal(
      signals, [&] { return generation.active_calls(); }, [&] { generation.StartDrain(); });
  (*front)->Shutdown();
  router->Stop();
  return 0;
}

int RunRouter(int argc, char** argv) {
  const sigset_t signals = BlockTerminationSignals();
  RouterFlags router_flags;
  ServerOptions server;
  server.port = 50051;
  HttpFlags http_flags;
  ApiKeyFlags key_flags;
  std::string model_dir = DefaultModelDir();
  FlagSet flags("router",
                "Serves the Generation gRPC API in front of prefill and decode workers: places\n"
                "requests by prefix affinity, relays KV reservations, retries and migrates.");
  flags.String("model", &model_dir, "model directory (only its tokenizer is loaded)");
  router_flags.Register(&flags);
  server.RegisterFlags(&flags);
  http_flags.Register(&flags);
  key_flags.Register(&flags);
  if (auto exit_code = flags.ParseCommandLine(argc, argv)) return *exit_code;
  auto metrics = StartServerProcess(server, "router");
  if (!metrics.ok()) {
    TLOG(ERROR) << metrics.status();
    return 1;
  }
  RouterMetrics router_metrics((*metrics)->registry());
  auto credentials = MakeChannelCredentials(server.tls);
  if (!credentials.ok()) {
    TLOG(ERROR) << credentials.status();
    return 2;
  }
  router_flags.channel_credentials = *credentials;
  auto router = RouterRuntime::Create(router_flags, model_dir, &router_metrics);
  if (!router.ok()) {
    TLOG(ERROR) << router.status();
    return 1;
  }
  if (int rc =
          ServeRouterUntilSignal(router->get(), signals, server, http_flags, key_flags, "router");
      rc != 0) {
    return rc;
  }
  TLOG(INFO) << "stopped";
  return 0;
}

}  // namespace tandem
