#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_transport.h"
#include "router/http/openai_request.h"
#include "tandem/v1/generation.grpc.pb.h"

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
};

// The OpenAI-compatible HTTP/1.1 API (on HttpTransport): POST /v1/completions,
// POST /v1/chat/completions, GET /v1/models, GET /health. A gateway onto the router's
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

  HttpServerOptions options_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  OpenAiContext context_;
  std::unique_ptr<HttpTransport> server_;
  int port_ = 0;
};

}  // namespace tandem
