// `tandem router`: the client-facing router of a disaggregated cluster.

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "common/base/log.h"
#include "common/metrics/process_metrics.h"
#include "common/metrics/router_metrics.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/http_api.h"
#include "tools/router_runtime.h"

namespace tandem {

int RunRouter(int argc, char** argv) {
  const sigset_t signals = BlockTerminationSignals();
  RouterFlags router_flags;
  ServerFlags server_flags;
  HttpFlags http_flags;
  ApiKeyFlags key_flags;
  std::string model_dir = DefaultModelDir();
  FlagSet flags("router",
                "Serves the Generation gRPC API in front of prefill and decode workers: places\n"
                "requests by prefix affinity, relays KV reservations, retries and migrates.");
  flags.String("model", &model_dir, "model directory (only its tokenizer is loaded)");
  router_flags.Register(&flags);
  server_flags.Register(&flags, 50051);
  http_flags.Register(&flags);
  key_flags.Register(&flags);
  if (auto st = flags.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) return 0;
  ConfigureLogging({LogLevel::kInfo, server_flags.log_json, "router"});
  auto metrics = ProcessMetrics::Start(server_flags.Metrics(), "router", server_flags.host);
  if (!metrics.ok()) {
    TLOG(ERROR) << metrics.status();
    return 1;
  }
  RouterMetrics router_metrics((*metrics)->registry());
  auto credentials = MakeChannelCredentials(server_flags);
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
  auto keys = ApiKeys::Start(key_flags, &(*router)->generation());
  if (!keys.ok()) {
    TLOG(ERROR) << keys.status();
    return 1;
  }
  auto server = StartGrpcServer(server_flags, (*router)->services());
  if (!server.ok()) {
    TLOG(ERROR) << server.status();
    return 1;
  }
  TLOG(INFO) << "router serving on " << server_flags.host << ":" << server->port;
  auto http = HttpApi::Start(http_flags, server_flags, server->server.get(),
                             &(*router)->tokenizer(), (*router)->generation().options().model_name,
                             (*router)->generation().options().max_model_len);
  if (!http.ok()) {
    TLOG(ERROR) << http.status();
    return 1;
  }
  const int sig = WaitForTerminationSignal(signals);
  TLOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining";
  (*router)->generation().StartDrain();
  server->server->GetHealthCheckService()->SetServingStatus(false);
  const absl::Time deadline = absl::Now() + absl::Seconds(server_flags.drain_timeout_s);
  while ((*router)->generation().active_calls() > 0 && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (*http != nullptr) (*http)->Stop();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  (*router)->Stop();
  TLOG(INFO) << "stopped";
  return 0;
}

}  // namespace tandem
