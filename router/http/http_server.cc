#include "router/http/http_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/rpc/callback_cq.h"
#include "common/tokenizer/tokenizer.h"
#include "router/http/generate_stream.h"
#include "router/http/lora_routes.h"
#include "router/http/openai_response.h"
#include "router/http/request_id.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void SendError(HttpResponder& res, absl::StatusCode code, const std::string& message) {
  OpenAiError e = MakeOpenAiError(code, message);
  res.Send(e.http_status, "application/json", Dump(e.body));
}

std::vector<std::pair<std::string, std::string>> ForwardedMetadata(const HttpRequest& req) {
  std::vector<std::pair<std::string, std::string>> md;
  if (req.has_header("Authorization")) {
    md.emplace_back("authorization", req.get_header_value("Authorization"));
  }
  return md;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One generate response, on its connection's event loop (every method runs there): reads the
// call's messages as they arrive and writes them out, committing the HTTP status when the first
// tokens arrive or at the first keep-alive tick, whichever is first.
struct Exchange {
  std::shared_ptr<GenerateStream> stream;
  std::unique_ptr<OpenAiResponder> responder;
  std::shared_ptr<HttpResponder> http;
  bool stream_mode = false;
  bool include_usage = false;
  bool committed = false;
  bool finished = false;
  bool wrote = false;  // since the last tick

  ~Exchange() {
    if (stream != nullptr && !finished) stream->Cancel();
  }

  void WriteEvent(const Json& j) { http->Write("data: " + Dump(j) + "\n\n"); }

  void Commit() {
    committed = true;
    if (stream_mode) {
      http->StartChunked(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    } else {
      http->StartChunked(200, "application/json");
    }
  }

  // Drains what the call produced so far.
  void Pump() {
    if (finished) return;
    v1::GenerateResponse m;
    while (true) {
      switch (stream->Poll(&m)) {
        case GenerateStream::Next::kNone:
          return;
        case GenerateStream::Next::kMessage:
          if (stream_mode) {
            if (!committed) Commit();
            for (const Json& chunk : responder->StreamChunks(m)) WriteEvent(chunk);
            wrote = true;
          } else {
            responder->Accumulate(m);
          }
          break;
        case GenerateStream::Next::kDone:
          return End();
      }
    }
  }

  void End() {
    finished = true;
    const grpc::Status st = stream->status();
    std::optional<OpenAiError> error;
    if (!st.ok()) {
      error = MakeOpenAiError(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
    }
    if (!committed && error.has_value()) {
      // Refused before the status went out: the request gets its own status.
      return http->Send(error->http_status, "application/json", Dump(error->body));
    }
    if (!stream_mode) {
      const std::string body = Dump(error.has_value() ? error->body : responder->Complete());
      if (!committed) return http->Send(200, "application/json", body);
      http->Write(body);
      return http->Finish();
    }
    if (!committed) Commit();
    if (error.has_value()) {
      WriteEvent(error->body);
    } else if (include_usage) {
      WriteEvent(responder->UsageChunk());
    }
    http->Write("data: [DONE]\n\n");
    http->Finish();
  }

  // Every keep-alive interval: commits the status if still waiting, and writes a keep-alive
  // when nothing went out since the last tick (a failed write shows the client went away).
  void Tick() {
    if (finished) return;
    if (!committed) {
      Commit();
      wrote = false;
    }
    if (!wrote) http->Write(stream_mode ? ": keep-alive\n\n" : " ");
    wrote = false;
  }
};

}  // namespace

void HttpServer::Tokenize(const HttpRequest& req, std::shared_ptr<HttpResponder> res) {
  auto body = ParseJsonBody(req.body, options_.limits);
  if (!body.ok())
    return SendError(*res, body.status().code(), std::string(body.status().message()));
  auto text = TokenizeRequestText(*body, context_);
  if (!text.ok())
    return SendError(*res, text.status().code(), std::string(text.status().message()));
  // The Generation service tokenizes: the same key, model and size checks as every call.
  grpc::ClientContext ctx;
  for (const auto& [k, v] : ForwardedMetadata(req)) ctx.AddMetadata(k, v);
  v1::TokenizeRequest t;
  t.set_model(text->model);
  t.set_text(text->text);
  t.set_add_special_tokens(text->add_special_tokens);
  v1::TokenizeResponse tokens;
  const grpc::Status st = stub_->Tokenize(&ctx, t, &tokens);
  if (!st.ok()) {
    return SendError(*res, static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  }
  Json out = {
      {"count", tokens.token_ids_size()},
      {"max_model_len", options_.max_model_len},
      {"tokens", std::vector<int32_t>(tokens.token_ids().begin(), tokens.token_ids().end())}};
  if (text->return_token_strs) {
    out["token_strs"] = std::vector<std::string>(tokens.tokens().begin(), tokens.tokens().end());
  }
  res->Send(200, "application/json", Dump(out));
}

void HttpServer::Detokenize(const HttpRequest& req, std::shared_ptr<HttpResponder> res) {
  auto body = ParseJsonBody(req.body, options_.limits);
  if (!body.ok())
    return SendError(*res, body.status().code(), std::string(body.status().message()));
  auto ids = DetokenizeRequestIds(*body, context_);
  if (!ids.ok()) return SendError(*res, ids.status().code(), std::string(ids.status().message()));
  auto text = context_.tokenizer->Decode(*ids, /*skip_special_tokens=*/false);
  if (!text.ok()) {
    return SendError(*res, absl::StatusCode::kInvalidArgument,
                     absl::StrCat("tokens: ", text.status().message()));
  }
  Json out = Json::object();
  out["prompt"] = *text;
  res->Send(200, "application/json", Dump(out));
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, std::shared_ptr<grpc::Channel> channel,
    const Tokenizer* tokenizer, const ChatTemplate* chat_template) {
  PinCallbackCompletionQueue();  // the streams' reactors run on it
  std::unique_ptr<HttpServer> s(new HttpServer);
  s->options_ = options;
  s->stub_ = v1::Generation::NewStub(channel);
  s->admin_ = v1::RouterAdmin::NewStub(channel);
  s->context_.tokenizer = tokenizer;
  s->context_.chat_template = chat_template;
  s->context_.max_model_len = options.max_model_len;
  s->context_.limits = options.limits;
  s->context_.tool_parser = options.tool_parser;
  s->context_.reasoning_parser = options.reasoning_parser;
  s->context_.constrain_reasoning = options.constrain_reasoning;
  s->context_.auto_tool_choice = options.auto_tool_choice;
  // The transport's own refusals (404, 405, 413, 431, malformed) in the API's error shape.
  auto error_page = [](int status, const std::string& message) {
    const absl::StatusCode code = status == 404   ? absl::StatusCode::kNotFound
                                  : status == 401 ? absl::StatusCode::kUnauthenticated
                                  : status == 403 ? absl::StatusCode::kPermissionDenied
                                  : status == 429 ? absl::StatusCode::kResourceExhausted
                                  : status >= 500 ? absl::StatusCode::kInternal
                                                  : absl::StatusCode::kInvalidArgument;
    return Dump(MakeOpenAiError(code, message).body);
  };
  auto server = HttpTransport::Start(options.transport, s->Routes(), error_page);
  if (!server.ok()) return server.status();
  s->server_ = std::move(server).value();
  s->port_ = s->server_->port();
  return s;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (server_ != nullptr) server_->Stop();
}

std::vector<HttpRoute> HttpServer::Routes() {
  std::vector<HttpRoute> routes;
  routes.push_back({"GET", "/health", [](const HttpRequest&, std::shared_ptr<HttpResponder> res) {
                      res->Send(200, "text/plain", "ok\n");
                    }});
  routes.push_back(
      {"GET", "/v1/models", [this](const HttpRequest& req, std::shared_ptr<HttpResponder> res) {
         grpc::ClientContext ctx;
         for (const auto& [k, v] : ForwardedMetadata(req)) ctx.AddMetadata(k, v);
         v1::ListModelsResponse models;
         const grpc::Status st = stub_->ListModels(&ctx, v1::ListModelsRequest(), &models);
         if (!st.ok()) {
           SendError(*res, static_cast<absl::StatusCode>(st.error_code()), st.error_message());
           return;
         }
         Json data = Json::array();
         for (const v1::ModelInfo& m : models.models()) {
           data.push_back({{"id", m.name()},
                           {"object", "model"},
                           {"created", 0},
                           {"owned_by", "tandem"},
                           {"root", m.root().empty() ? m.name() : m.root()},
                           {"parent", m.parent().empty() ? Json() : Json(m.parent())},
                           {"max_model_len", m.max_model_len()}});
         }
         res->Send(200, "application/json", Dump({{"object", "list"}, {"data", data}}));
       }});
  auto generate = [this](OpenAiEndpoint endpoint) {
    return [this, endpoint](const HttpRequest& req, std::shared_ptr<HttpResponder> res) {
      auto body = ParseJsonBody(req.body, options_.limits);
      if (!body.ok())
        return SendError(*res, body.status().code(), std::string(body.status().message()));
      auto converted = ConvertOpenAiRequest(endpoint, *body, context_);
      if (!converted.ok()) {
        return SendError(*res, converted.status().code(),
                         std::string(converted.status().message()));
      }
      const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
      v1::GenerateRequest& g = converted->generate;
      // Logprobs: token texts in context; return_token_ids: the prompt's ids.
      if (converted->logprobs || converted->return_token_ids) g.set_echo_prompt_ids(true);
      // Unpredictable (128 random bits): the completion's id is its request id, and no client
      // may guess another's to squat it or to find it in logs.
      if (g.request_id().empty()) g.set_request_id(RandomRequestId(chat ? "chatcmpl-" : "cmpl-"));
      if (!converted->user.empty()) {
        TLOG(INFO) << "http request " << g.request_id() << " for user '" << converted->user << "'";
      }
      auto x = std::make_shared<Exchange>();
      OpenAiResponderOptions ro;
      ro.endpoint = endpoint;
      ro.id = g.request_id();
      ro.created = UnixNow();
      ro.model = g.model().empty() ? options_.model_name : g.model();
      ro.n = g.n() == 0 ? 1 : g.n();
      ro.logprobs = converted->logprobs;
      ro.include_usage = converted->include_usage;
      ro.tokenizer = context_.tokenizer;
      ro.chat = converted->chat;
      ro.return_token_ids = converted->return_token_ids;
      ro.drop_eos_text = converted->drop_eos_text;
      x->responder = std::make_unique<OpenAiResponder>(ro);
      x->stream_mode = converted->stream;
      x->include_usage = converted->include_usage;
      x->http = res;

      // From here on the exchange lives on the connection's event loop: the connection holds
      // it (through its ticker and on-close callback) until the response ends; the call's
      // notifications only post onto the loop.
      res->SetOnClose([x] {
        if (x->stream != nullptr) x->stream->Cancel();  // the client went away
      });
      res->SetTicker(options_.keepalive_interval, [x] { x->Tick(); });
      std::weak_ptr<Exchange> weak = x;
      res->Post([this, x, weak, g = std::move(g), md = ForwardedMetadata(req)] {
        x->stream = GenerateStream::Start(stub_.get(), g, md, [weak, http = x->http] {
          http->Post([weak] {
            if (auto x = weak.lock()) x->Pump();
          });
        });
      });
    };
  };
  routes.push_back({"POST", "/tokenize",
                    [this](const HttpRequest& req, auto res) { Tokenize(req, std::move(res)); }});
  routes.push_back({"POST", "/detokenize",
                    [this](const HttpRequest& req, auto res) { Detokenize(req, std::move(res)); }});
  routes.push_back({"POST", "/v1/completions", generate(OpenAiEndpoint::kCompletions)});
  routes.push_back({"POST", "/v1/chat/completions", generate(OpenAiEndpoint::kChatCompletions)});
  for (HttpRoute& r : LoraAdapterRoutes(admin_.get(), options_.limits)) {
    routes.push_back(std::move(r));
  }
  if (options_.authorize) {
    // Every API route checks the key on its headers: no body work for an unauthenticated client.
    auto admission = [authorize = options_.authorize](const HttpRequest& head,
                                                      bool limits) -> std::optional<HttpRefusal> {
      const absl::Status st = authorize(head.get_header_value("Authorization"), limits);
      if (st.ok()) return std::nullopt;
      const absl::StatusCode code = st.code();
      return HttpRefusal{MakeOpenAiError(code, std::string(st.message())).http_status,
                         std::string(st.message()),
                         code == absl::StatusCode::kResourceExhausted  ? "rate_limited"
                         : code == absl::StatusCode::kPermissionDenied ? "permission_denied"
                                                                       : "unauthenticated"};
    };
    for (HttpRoute& route : routes) {
      if (route.path == "/health") continue;
      // Generate routes (not the admin's LoRA routes).
      const bool limits =
          route.method == "POST" && route.path.find("lora_adapter") == std::string::npos;
      route.admission = [admission, limits](const HttpRequest& head) {
        return admission(head, limits);
      };
    }
  }
  return routes;
}

}  // namespace tandem
