#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "router/http/openai_request.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace tandem {

class ChatTemplate;
class Tokenizer;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free port
  size_t max_body_bytes = 4 << 20;
  int threads = 32;  // concurrent HTTP requests (streams included)
  std::string model_name;
  int32_t max_model_len = 0;
  OpenAiLimits limits;
  // While a response waits for tokens, a keep-alive (an SSE comment, or a space before a JSON
  // body) goes out this often: that is how a client that went away is noticed and its request
  // cancelled.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // HTTPS when tls_cert is set; with tls_client_ca, clients must present a certificate it signed.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
};

// The OpenAI-compatible HTTP/1.1 API (cpp-httplib): POST /v1/completions,
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
  void Register();

  HttpServerOptions options_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  OpenAiContext context_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace tandem
