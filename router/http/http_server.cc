#include "router/http/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/http/http_server_factory.h"
#include "common/rpc/callback_cq.h"
#include "router/http/generate_stream.h"
#include "router/http/openai_response.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void SendError(httplib::Response& res, absl::StatusCode code, const std::string& message) {
  OpenAiError e = MakeOpenAiError(code, message);
  res.status = e.http_status;
  res.set_content(Dump(e.body), "application/json");
}

std::vector<std::pair<std::string, std::string>> ForwardedMetadata(const httplib::Request& req) {
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

std::atomic<uint64_t> next_http_id{1};

// State of one response shared with httplib's content provider.
struct Exchange {
  std::unique_ptr<GenerateStream> stream;
  std::unique_ptr<OpenAiResponder> responder;
  std::optional<v1::GenerateResponse> first;  // read before the status was committed
  bool stream_mode = false;
  bool include_usage = false;
  absl::Duration keepalive;
};

bool Write(httplib::DataSink& sink, const std::string& data) {
  return sink.is_writable() && sink.write(data.data(), data.size());
}

bool WriteEvent(httplib::DataSink& sink, const Json& j) {
  return Write(sink, "data: " + Dump(j) + "\n\n");
}

// Streams SSE events until the call ends; false when the client went away.
bool PumpEvents(Exchange& x, httplib::DataSink& sink) {
  auto send = [&](const v1::GenerateResponse& m) {
    for (const Json& chunk : x.responder->StreamChunks(m)) {
      if (!WriteEvent(sink, chunk)) return false;
    }
    return true;
  };
  if (x.first.has_value() && !send(*x.first)) return false;
  x.first.reset();
  v1::GenerateResponse m;
  while (true) {
    switch (x.stream->Wait(x.keepalive, &m)) {
      case GenerateStream::Next::kMessage:
        if (!send(m)) return false;
        break;
      case GenerateStream::Next::kTimeout:
        if (!Write(sink, ": keep-alive\n\n")) return false;
        break;
      case GenerateStream::Next::kDone: {
        const grpc::Status st = x.stream->status();
        if (!st.ok()) {
          OpenAiError e =
              MakeOpenAiError(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
          if (!WriteEvent(sink, e.body)) return false;
        } else if (x.include_usage && !WriteEvent(sink, x.responder->UsageChunk())) {
          return false;
        }
        if (!Write(sink, "data: [DONE]\n\n")) return false;
        sink.done();
        return true;
      }
    }
  }
}

// Non-streaming after the status was committed: keep-alive spaces, then the JSON body.
bool PumpJson(Exchange& x, httplib::DataSink& sink) {
  if (x.first.has_value()) x.responder->Accumulate(*x.first);
  x.first.reset();
  v1::GenerateResponse m;
  while (true) {
    switch (x.stream->Wait(x.keepalive, &m)) {
      case GenerateStream::Next::kMessage:
        x.responder->Accumulate(m);
        break;
      case GenerateStream::Next::kTimeout:
        if (!Write(sink, " ")) return false;
        break;
      case GenerateStream::Next::kDone: {
        const grpc::Status st = x.stream->status();
        const Json body = st.ok() ? x.responder->Complete()
                                  : MakeOpenAiError(static_cast<absl::StatusCode>(st.error_code()),
                                                    st.error_message())
                                        .body;
        if (!Write(sink, Dump(body))) return false;
        sink.done();
        return true;
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, std::shared_ptr<grpc::Channel> channel,
    const Tokenizer* tokenizer, const ChatTemplate* chat_template) {
  PinCallbackCompletionQueue();  // the streams' reactors run on it
  std::unique_ptr<HttpServer> s(new HttpServer);
  s->options_ = options;
  s->stub_ = v1::Generation::NewStub(channel);
  s->context_.tokenizer = tokenizer;
  s->context_.chat_template = chat_template;
  s->context_.max_model_len = options.max_model_len;
  s->context_.limits = options.limits;
  auto made = NewHttpServer({options.tls_cert, options.tls_key, options.tls_client_ca}, "http");
  if (!made.ok()) return made.status();
  s->server_ = std::move(made).value();
  const int threads = options.threads;
  s->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s->server_->set_payload_max_length(options.max_body_bytes);
  s->Register();
  const int port = options.port == 0
                       ? s->server_->bind_to_any_port(options.host)
                       : (s->server_->bind_to_port(options.host, options.port) ? options.port : -1);
  if (port < 0) {
    return absl::UnavailableError(
        absl::StrCat("http: cannot listen on ", options.host, ":", options.port));
  }
  s->port_ = port;
  httplib::Server* server = s->server_.get();
  s->thread_ = std::thread([server] { server->listen_after_bind(); });
  return s;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Register() {
  httplib::Server& srv = *server_;
  srv.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    absl::StatusCode code = absl::StatusCode::kInternal;
    std::string message = "error";
    switch (res.status) {
      case 404:
        code = absl::StatusCode::kNotFound;
        message = "no such endpoint";
        break;
      case 405:
        code = absl::StatusCode::kInvalidArgument;
        message = "method not allowed";
        break;
      case 413:
        code = absl::StatusCode::kInvalidArgument;
        message = "the request body is too large";
        break;
      case 400:
        code = absl::StatusCode::kInvalidArgument;
        message = "malformed HTTP request";
        break;
      default:
        break;
    }
    const int status = res.status;
    SendError(res, code, message);
    res.status = status;
  });
  srv.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, absl::StatusCode::kInternal, "internal error");
      });
  srv.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  srv.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    grpc::ClientContext ctx;
    for (const auto& [k, v] : ForwardedMetadata(req)) ctx.AddMetadata(k, v);
    v1::ListModelsResponse models;
    const grpc::Status st = stub_->ListModels(&ctx, v1::ListModelsRequest(), &models);
    if (!st.ok()) {
      SendError(res, static_cast<absl::StatusCode>(st.error_code()), st.error_message());
      return;
    }
    Json data = Json::array();
    for (const v1::ModelInfo& m : models.models()) {
      data.push_back({{"id", m.name()},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "tandem"},
                      {"max_model_len", m.max_model_len()}});
    }
    res.set_content(Dump({{"object", "list"}, {"data", data}}), "application/json");
  });
  auto generate = [this](OpenAiEndpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res) {
      auto body = ParseJsonBody(req.body, options_.limits);
      if (!body.ok())
        return SendError(res, body.status().code(), std::string(body.status().message()));
      auto converted = ConvertOpenAiRequest(endpoint, *body, context_);
      if (!converted.ok()) {
        return SendError(res, converted.status().code(), std::string(converted.status().message()));
      }
      const uint64_t serial = next_http_id.fetch_add(1);
      const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
      v1::GenerateRequest& g = converted->generate;
      if (converted->logprobs) g.set_echo_prompt_ids(true);  // token texts in context
      if (g.request_id().empty()) g.set_request_id(absl::StrCat("http-", UnixNow(), "-", serial));
      if (!converted->user.empty()) {
        TLOG(INFO) << "http request " << g.request_id() << " for user '" << converted->user << "'";
      }
      auto x = std::make_shared<Exchange>();
      OpenAiResponderOptions ro;
      ro.endpoint = endpoint;
      ro.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", g.request_id());
      ro.created = UnixNow();
      ro.model = g.model().empty() ? options_.model_name : g.model();
      ro.n = g.n() == 0 ? 1 : g.n();
      ro.logprobs = converted->logprobs;
      ro.include_usage = converted->include_usage;
      ro.tokenizer = context_.tokenizer;
      ro.tools = converted->tools;
      x->responder = std::make_unique<OpenAiResponder>(ro);
      x->stream_mode = converted->stream;
      x->include_usage = converted->include_usage;
      x->keepalive = options_.keepalive_interval;
      x->stream = std::make_unique<GenerateStream>(stub_.get(), g, ForwardedMetadata(req));

      // Before committing to 200: a request the service refuses ends at once with its status.
      v1::GenerateResponse first;
      switch (x->stream->Wait(options_.keepalive_interval, &first)) {
        case GenerateStream::Next::kDone: {
          const grpc::Status st = x->stream->status();
          if (!st.ok()) {
            return SendError(res, static_cast<absl::StatusCode>(st.error_code()),
                             st.error_message());
          }
          break;
        }
        case GenerateStream::Next::kMessage:
          x->first = std::move(first);
          break;
        case GenerateStream::Next::kTimeout:
          break;
      }
      if (x->stream_mode) res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          x->stream_mode ? "text/event-stream" : "application/json",
          [x](size_t, httplib::DataSink& sink) {
            const bool ok = x->stream_mode ? PumpEvents(*x, sink) : PumpJson(*x, sink);
            if (!ok) x->stream->Cancel();  // the client went away
            return ok;
          },
          [x](bool success) {
            if (!success) x->stream->Cancel();
          });
    };
  };
  srv.Post("/v1/completions", generate(OpenAiEndpoint::kCompletions));
  srv.Post("/v1/chat/completions", generate(OpenAiEndpoint::kChatCompletions));
}

}  // namespace tandem
