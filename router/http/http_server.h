#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_transport.h"
#include "router/http/openai_request.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/router_admin.grpc.pb.h"

namespace tandem {

class ChatTemplate;
class Tokenizer;

struct HttpServerOptions {
  // Listener, limits, TLS and metrics of the connections.
  HttpTransportOptions transport;
  std::string model_name;
  int32_t max_model_len = 0;
  OpenAiLimits limits;
  // While a response waits for tokens, a keep-alive (an SSE comment, or a space before a JSON
  // body) goes out this often: that is how a client that went away is noticed and its request
  // cancelled.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // With API keys: checks a request's Authorization header (and, with `limits`, its tenant's
  // limits: the generate routes) when its headers are in, before its body is read, parsed,
  // rendered or tokenized. UNAUTHENTICATED, PERMISSION_DENIED or RESOURCE_EXHAUSTED refuse it
  // (401, 403, 429) and close the connection. Empty: open access. The Generation service checks
  // the key and the limits again for the call itself.
  std::function<absl::Status(const std::string& authorization, bool limits)> authorize;
  // Chat outputs: the family's tool-call and reasoning parsers, and whether constraints cover
  // the reasoning block (OpenAiContext).
  ToolCallParser tool_parser = ToolCallParser::kJson;
  ReasoningParser reasoning_parser = ReasoningParser::kNone;
  bool constrain_reasoning = false;
  bool auto_tool_choice = true;  // tool_choice "auto" allowed (--enable-auto-tool-choice)
};

// The OpenAI-compatible HTTP/1.1 API (on HttpTransport): POST /v1/completions,
// POST /v1/chat/completions, GET /v1/models (LoRA adapters with their base as `parent`, as
// vLLM), GET /health, and vLLM's POST /tokenize, POST /detokenize, POST /v1/load_lora_adapter
// and POST /v1/unload_lora_adapter (lora_routes.h). A gateway onto the router's
// Generation gRPC service through an in-process channel, so validation, API keys, rate limits,
// tenant isolation, metrics and cancellation are the gRPC API's own. Thread-safe.
class HttpServer {
 public:
  // `channel`: an in-process channel of the server holding the Generation service.
  // `tokenizer` and `chat_template` must outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           std::shared_ptr<grpc::Channel> channel,
                                                           const Tokenizer* tokenizer,
                                                           const ChatTemplate* chat_template);
  ~HttpServer();

  int port() const { return port_; }
  // Stops accepting; in-flight responses end (their requests are cancelled).
  void Stop();

 private:
  HttpServer() = default;
  std::vector<HttpRoute> Routes();
  // vLLM's POST /tokenize (a prompt, or chat messages rendered by the template) and POST
  // /detokenize.
  void Tokenize(const HttpRequest& req, std::shared_ptr<HttpResponder> res);
  void Detokenize(const HttpRequest& req, std::shared_ptr<HttpResponder> res);

  HttpServerOptions options_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<v1::RouterAdmin::Stub> admin_;  // runtime LoRA loading (lora_routes.h)
  OpenAiContext context_;
  std::unique_ptr<HttpTransport> server_;
  int port_ = 0;
};

}  // namespace tandem
