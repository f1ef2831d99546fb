#pragma once

#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/server.h"
#include "common/tokenizer/tokenizer.h"
#include "router/generation_service.h"
#include "router/http_api.h"

namespace tandem {

// The client-facing listeners of a process that serves the Generation API (`tandem router`,
// `tandem serve`): the API keys, the gRPC server with the process's services, and the HTTP API
// in front of it. Destroy it before the GenerationService.
class GenerationFront {
 public:
  // Starts them; `label` names what serves in the log line ("router", "model 'm'", ...).
  static absl::StatusOr<std::unique_ptr<GenerationFront>> Start(
      const ServerOptions& server, const HttpFlags& http, const ApiKeyFlags& keys,
      GenerationService* generation, const Tokenizer* tokenizer,
      const std::vector<grpc::Service*>& services, const std::string& label);

  // Waits for SIGTERM or SIGINT, drains (DrainOnSignal: `start_drain`, then `active` calls get
  // --drain-timeout) and stops the HTTP API.
  void DrainOnSignal(const sigset_t& signals, const std::function<int64_t()>& active,
                     const std::function<void()>& start_drain);
  // Shuts the gRPC server down (what still runs gets 5 s).
  void Shutdown();

 private:
  GenerationFront() = default;
  double drain_timeout_s_ = 0;
  std::unique_ptr<ApiKeys> keys_;
  RunningServer server_;
  std::unique_ptr<HttpApi> http_;
};

}  // namespace tandem
