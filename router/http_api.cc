#include "router/http_api.h"

#include <csignal>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {

void HttpFlags::Register(FlagSet* f) {
  f->Int("http-port", &port, "OpenAI-compatible HTTP API port (0: any free port; -1: off)");
  f->String("http-port-file", &port_file, "write the bound HTTP port to this file");
  f->Int("http-max-body-bytes", &max_body_bytes, "largest HTTP request body (413 above)");
  f->Int("http-threads", &threads, "HTTP requests served at once (streams included)");
  f->String("chat-template", &chat_template,
            "llama-2, llama-3, chatml or a template file (default: tokenizer_config.json's)");
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
    const Tokenizer* tokenizer, const std::string& model_name, int32_t max_model_len) {
  if (flags.port < 0) return std::unique_ptr<HttpApi>();
  if (flags.max_body_bytes < 1024 || flags.threads < 1) {
    return absl::InvalidArgumentError("--http-max-body-bytes >= 1024 and --http-threads >= 1");
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
  const std::string& host = server_options.host;
  o.host = host;
  o.port = static_cast<int>(flags.port);
  o.max_body_bytes = static_cast<size_t>(flags.max_body_bytes);
  o.threads = static_cast<int>(flags.threads);
  o.model_name = model_name;
  o.max_model_len = max_model_len;
  o.tls_cert = server_options.tls.cert;
  o.tls_key = server_options.tls.key;
  if (server_options.tls.client_auth) o.tls_client_ca = server_options.tls.ca;
  auto server = HttpServer::Start(o, grpc_server->InProcessChannel(grpc::ChannelArguments()),
                                  tokenizer, api->chat_template_.get());
  if (!server.ok()) return server.status();
  api->server_ = std::move(server).value();
  if (!flags.port_file.empty()) {
    WriteFileAtomically(flags.port_file, absl::StrCat(api->server_->port(), "\n"));
  }
  TLOG(INFO) << "OpenAI-compatible HTTP API on " << host << ":" << api->server_->port() << " ("
             << (server_options.tls.cert.empty() ? "http" : "https")
             << ", chat template: " << choice->origin << ")";
  return api;
}

}  // namespace tandem
