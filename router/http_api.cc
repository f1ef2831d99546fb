#include "router/http_api.h"

#include <csignal>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {

void HttpFlags::Register(FlagSet* f) {
  f->Int("http-port", &port, "OpenAI-compatible HTTP API port (0: any free port; -1: off)");
  f->String("http-port-file", &port_file, "write the bound HTTP port to this file");
  HttpTransportOptions& t = transport;
  f->Int("http-max-body-bytes", &t.max_body_bytes, "largest HTTP request body (413 above)");
  f->Int32("http-threads", &t.handler_threads,
           "threads that parse and convert HTTP requests (connections and streams hold none)");
  f->Int32("http-io-threads", &t.io_threads, "HTTP event-loop threads (they move the bytes)");
  f->Int("http-max-header-bytes", &t.max_header_bytes,
         "largest HTTP request line and headers (431 above)");
  f->Int32("http-max-headers", &t.max_headers, "most HTTP request headers (431 above)");
  f->Double("http-header-timeout", &t.header_timeout_s,
            "seconds a connection has to send its request headers (and TLS handshake)");
  f->Double("http-body-timeout", &t.body_timeout_s,
            "seconds a request body has, plus its length at --http-body-min-rate");
  f->Int("http-body-min-rate", &t.body_min_rate, "slowest accepted request body, in bytes/s");
  f->Double("http-idle-timeout", &t.idle_timeout_s,
            "seconds a kept-alive HTTP connection may wait for its next request");
  f->Double("http-write-timeout", &t.write_timeout_s,
            "seconds a response write may make no progress before the connection is closed");
  f->Int("http-max-buffered-bytes", &t.max_buffered_bytes,
         "response bytes queued for a client that does not read (a stream is cut and its "
         "request cancelled above)");
  f->Int32("http-max-connections", &t.max_connections, "most open HTTP connections");
  f->Int32("http-max-connections-per-client", &t.max_connections_per_client,
           "most open HTTP connections from one IP address (0: no limit)");
  f->Int32("http-max-requests-per-connection", &t.max_requests_per_connection,
           "requests served on one kept-alive HTTP connection before it is closed");
  f->String("chat-template", &chat_template,
            "llama-2, llama-3, chatml or a template file (default: tokenizer_config.json's)");
  f->String("tool-call-parser", &tool_call_parser,
            "how tool calls are read from outputs: auto (from the chat template), hermes, "
            "llama3_json, pythonic, mistral, phi4_mini_json, deepseek_v3, deepseek_v31, "
            "qwen3_coder, glm45, minimax_m2, kimi_k2, json");
  f->Bool("enable-auto-tool-choice", &enable_auto_tool_choice,
          "the model decides when to call tools (tool_choice auto, OpenAI's default with tools); "
          "--no-enable-auto-tool-choice refuses it as vLLM does without the flag");
  f->String("reasoning-parser", &reasoning_parser,
            "how reasoning is separated into reasoning_content: auto (on where the chat "
            "template writes <think>), deepseek_r1, qwen3, mistral, none");
  f->Bool("structured-outputs-enable-in-reasoning", &structured_outputs_enable_in_reasoning,
          "output constraints (response_format, guided_*, tool_choice) cover the reasoning "
          "block too (default: the answer after it only)");
}

void ApiKeyFlags::Register(FlagSet* f) {
  f->String("api-keys", &path,
            "API key file (hashed keys -> tenants with limits; reloaded on SIGHUP); "
            "default: no keys needed");
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Start(const ApiKeyFlags& flags,
                                                        GenerationService* service) {
  if (flags.path.empty()) return std::unique_ptr<ApiKeys>();
  std::unique_ptr<ApiKeys> keys(new ApiKeys);
  auto access = AccessControl::Load(flags.path);
  if (!access.ok()) return access.status();
  keys->access_ = std::move(access).value();
  service->set_access_control(keys->access_.get());
  AccessControl* ac = keys->access_.get();
  std::atomic<bool>* stop = &keys->stop_;
  const std::string path = flags.path;
  keys->reloader_ = std::thread([ac, stop, path] {
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    const timespec tick = {0, 200 * 1000 * 1000};
    while (!stop->load()) {
      if (sigtimedwait(&hup, nullptr, &tick) != SIGHUP) continue;
      if (absl::Status st = ac->Reload(); st.ok()) {
        TLOG(INFO) << "SIGHUP: reloaded the API keys from " << path;
      } else {
        TLOG(ERROR) << "SIGHUP: kept the previous API keys: " << st;
      }
    }
  });
  TLOG(INFO) << "API keys required (" << flags.path << ")";
  return keys;
}

ApiKeys::~ApiKeys() {
  stop_.store(true);
  if (reloader_.joinable()) reloader_.join();
}

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(
    const HttpFlags& flags, const ServerOptions& server_options, grpc::Server* grpc_server,
    const Tokenizer* tokenizer, const std::string& model_name, int32_t max_model_len,
    HttpHooks* hooks, AccessControl* access) {
  if (flags.port < 0) return std::unique_ptr<HttpApi>();
  const HttpTransportOptions& t = flags.transport;
  if (t.max_body_bytes < 1024 || t.handler_threads < 1 || t.io_threads < 1 ||
      t.max_header_bytes < 1024 || t.max_headers < 1 || t.body_min_rate < 1 ||
      t.max_buffered_bytes < 4096 || t.max_connections < 1 || t.max_connections_per_client < 0 ||
      t.max_requests_per_connection < 1 || !(t.header_timeout_s > 0) || !(t.body_timeout_s > 0) ||
      !(t.idle_timeout_s > 0) || !(t.write_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        "--http-max-body-bytes and --http-max-header-bytes >= 1024, --http-max-buffered-bytes "
        ">= 4096, the HTTP timeouts > 0, --http-max-connections-per-client >= 0 and the other "
        "--http-* counts >= 1");
  }
  std::unique_ptr<HttpApi> api(new HttpApi);
  auto choice = ChooseChatTemplate(*tokenizer, flags.chat_template);
  if (!choice.ok()) return choice.status();
  auto parsed = ChatTemplate::Parse(choice->source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template (", choice->origin, "): ", parsed.status().message()));
  }
  api->chat_template_ = std::move(parsed).value();
  HttpServerOptions o;
  o.tool_parser = ToolCallParserOfTemplate(choice->source);
  if (flags.tool_call_parser != "auto") {
    auto p = ToolCallParserByName(flags.tool_call_parser);
    if (!p.ok()) return p.status();
    o.tool_parser = *p;
  }
  o.reasoning_parser = ReasoningParserOfTemplate(choice->source);
  if (flags.reasoning_parser != "auto") {
    auto p = ReasoningParserByName(flags.reasoning_parser);
    if (!p.ok()) return p.status();
    o.reasoning_parser = *p;
  }
  o.constrain_reasoning = flags.structured_outputs_enable_in_reasoning;
  o.auto_tool_choice = flags.enable_auto_tool_choice;
  const std::string& host = server_options.host;
  o.transport = t;
  o.transport.host = host;
  o.transport.port = static_cast<int>(flags.port);
  o.transport.hooks = hooks;
  o.model_name = model_name;
  o.max_model_len = max_model_len;
  o.transport.tls_cert = server_options.tls.cert;
  o.transport.tls_key = server_options.tls.key;
  if (server_options.tls.client_auth) o.transport.tls_client_ca = server_options.tls.ca;
  if (access != nullptr) {
    o.authorize = [access](const std::string& authorization, bool limits) -> absl::Status {
      auto tenant = access->AuthenticateHeader(authorization);
      if (!tenant.ok()) return tenant.status();
      return limits ? access->CheckLimits(**tenant) : absl::OkStatus();
    };
  }
  auto server = HttpServer::Start(o, grpc_server->InProcessChannel(grpc::ChannelArguments()),
                                  tokenizer, api->chat_template_.get());
  if (!server.ok()) return server.status();
  api->server_ = std::move(server).value();
  if (!flags.port_file.empty()) {
    WriteFileAtomically(flags.port_file, absl::StrCat(api->server_->port(), "\n"));
  }
  TLOG(INFO) << "OpenAI-compatible HTTP API on " << host << ":" << api->server_->port() << " ("
             << (server_options.tls.cert.empty() ? "http" : "https")
             << ", chat template: " << choice->origin
             << ", tool-call parser: " << ToolCallParserName(o.tool_parser)
             << ", reasoning parser: " << ReasoningParserName(o.reasoning_parser) << ")";
  return api;
}

}  // namespace tandem
