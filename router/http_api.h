#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/rpc/server.h"
#include "common/tokenizer/chat_template.h"
#include "router/access_control.h"
#include "router/generation_service.h"
#include "router/http/http_server.h"
#include "common/http/http_transport.h"

namespace tandem {

// Flags of the OpenAI-compatible HTTP API (`tandem serve`, `tandem router`).
struct HttpFlags {
  int64_t port = -1;  // -1: off; 0: any free port
  std::string port_file;
  // The transport's limits; flags read their defaults from here.
  HttpTransportOptions transport;
  std::string chat_template;  // llama-2, llama-3, chatml or a file; default: the tokenizer's

  void Register(FlagSet* flags);
};

// API keys (`--api-keys`, router/access_control.h), reloaded on SIGHUP.
struct ApiKeyFlags {
  std::string path;
  void Register(FlagSet* flags);
};

// Loads the key file into `service` and reloads it on every SIGHUP until destroyed (which
// must happen before the service's). Null (and OK) without --api-keys. Requires SIGHUP blocked
// in every thread (BlockTerminationSignals, common/rpc/shutdown.h).
class ApiKeys {
 public:
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Start(const ApiKeyFlags& flags,
                                                        GenerationService* service);
  ~ApiKeys();
  // The keys (reloaded in place on SIGHUP).
  AccessControl* access() const { return access_.get(); }

 private:
  std::unique_ptr<AccessControl> access_;
  std::atomic<bool> stop_{false};
  std::thread reloader_;
};

// The HTTP API of a process serving the Generation service on `grpc_server`.
class HttpApi {
 public:
  // Null (and OK) when --http-port is off.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(
      const HttpFlags& flags, const ServerOptions& server_options, grpc::Server* grpc_server,
      const Tokenizer* tokenizer, const std::string& model_name, int32_t max_model_len,
      HttpHooks* hooks = nullptr);
  int port() const { return server_->port(); }
  void Stop() { server_->Stop(); }

 private:
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace tandem
