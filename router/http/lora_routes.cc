#include "router/http/lora_routes.h"

#include "absl/strings/str_cat.h"
#include "router/http/openai_response.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

void SendLoraError(HttpResponder& res, absl::StatusCode code, const std::string& message) {
  // A name already loaded, or the limit of loaded adapters reached: the request's fault (400, as
  // vLLM answers), not a server error or a rate limit.
  if (code == absl::StatusCode::kAlreadyExists || code == absl::StatusCode::kResourceExhausted) {
    code = absl::StatusCode::kFailedPrecondition;
  }
  OpenAiError e = MakeOpenAiError(code, message);
  res.Send(e.http_status, "application/json",
           e.body.dump(-1, ' ', false, Json::error_handler_t::replace));
}

// The string field `key` of `body`: required and non-empty.
absl::StatusOr<std::string> Field(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": a non-empty string is required"));
  }
  return it->get<std::string>();
}

}  // namespace

std::vector<HttpRoute> LoraAdapterRoutes(v1::RouterAdmin::Stub* admin, const OpenAiLimits& limits) {
  // Parses the body, calls `rpc` with the caller's Authorization, answers.
  auto route = [admin, limits](const char* path, bool load) {
    return HttpRoute{
        "POST", path,
        [admin, limits, load](const HttpRequest& req, std::shared_ptr<HttpResponder> res) {
          auto body = ParseJsonBody(req.body, limits);
          if (!body.ok()) {
            return SendLoraError(*res, body.status().code(), std::string(body.status().message()));
          }
          auto name = Field(*body, "lora_name");
          if (!name.ok())
            return SendLoraError(*res, name.status().code(), name.status().ToString());
          grpc::ClientContext ctx;
          if (req.has_header("Authorization")) {
            ctx.AddMetadata("authorization", req.get_header_value("Authorization"));
          }
          v1::LoraAdapterResponse out;
          grpc::Status st;
          if (load) {
            auto path = Field(*body, "lora_path");
            if (!path.ok())
              return SendLoraError(*res, path.status().code(), path.status().ToString());
            v1::LoadLoraAdapterRequest r;
            r.set_lora_name(*name);
            r.set_lora_path(*path);
            st = admin->LoadLoraAdapter(&ctx, r, &out);
          } else {
            v1::UnloadLoraAdapterRequest r;
            r.set_lora_name(*name);
            st = admin->UnloadLoraAdapter(&ctx, r, &out);
          }
          if (!st.ok()) {
            return SendLoraError(*res, static_cast<absl::StatusCode>(st.error_code()),
                                 st.error_message());
          }
          res->Send(200, "text/plain",
                    absl::StrCat(
                        "Success: LoRA adapter '", *name, "' ", load ? "added" : "removed",
                        " successfully.",
                        !load && out.in_use() > 0
                            ? absl::StrCat(" ", out.in_use(), " running requests finish with it.")
                            : "",
                        "\n"));
        },
        /*admission=*/{}};
  };
  return {route("/v1/load_lora_adapter", true), route("/v1/unload_lora_adapter", false)};
}

}  // namespace tandem
