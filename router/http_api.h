#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/http/http_transport.h"
#include "common/rpc/server.h"
#include "common/tokenizer/chat_template.h"
#include "router/access_control.h"
#include "router/generation_service.h"
#include "router/http/http_server.h"

namespace tandem {

// Flags of the OpenAI-compatible HTTP API (`tandem serve`, `tandem router`).
struct HttpFlags {
  int64_t port = -1;  // -1: off; 0: any free port
  std::string port_file;
  // The transport's limits; flags read their defaults from here.
  HttpTransportOptions transport;
  std::string chat_template;  // llama-2, llama-3, chatml or a file; default: the tokenizer's
  // vLLM's names (router/http/tool_parsers.h, reasoning_parser.h); "auto": from the template.
  std::string tool_call_parser = "auto";
  // vLLM's --enable-auto-tool-choice; on by default here (off: tool_choice "auto" is a 400).
  bool enable_auto_tool_choice = true;
  std::string reasoning_parser = "auto";
  // vLLM's structured_outputs_config.enable_in_reasoning: constraints cover the reasoning too.
  bool structured_outputs_enable_in_reasoning = false;

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
  // Null (and OK) when --http-port is off. `access` (null: open access; must outlive the API):
  // the API keys, checked on a request's headers before its body is read.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(
      const HttpFlags& flags, const ServerOptions& server_options, grpc::Server* grpc_server,
      const Tokenizer* tokenizer, const std::string& model_name, int32_t max_model_len,
      HttpHooks* hooks = nullptr, AccessControl* access = nullptr);
  int port() const { return server_->port(); }
  void Stop() { server_->Stop(); }

 private:
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace tandem
