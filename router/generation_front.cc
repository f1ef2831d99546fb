#include "router/generation_front.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "common/base/log.h"
#include "common/rpc/shutdown.h"

namespace tandem {
namespace {

// The public listener: the Generation API (its handlers check the API key and find the tenant),
// RouterAdmin for keys with the admin scope, nothing else.
std::shared_ptr<const CallPolicy> PublicPolicy(AccessControl* access) {
  auto policy = std::make_shared<CallPolicy>();
  policy->services["tandem.v1.Generation"] = nullptr;
  if (access == nullptr) {
    policy->services["tandem.v1.RouterAdmin"] = AllowAll();  // open access, as Generation
  } else {
    policy->services["tandem.v1.RouterAdmin"] = [access](absl::string_view,
                                                         const CallMetadata& md) {
      auto it = md.find("authorization");
      auto tenant = access->AuthenticateHeader(
          it == md.end() ? std::string() : std::string(it->second), kScopeAdmin);
      if (tenant.ok()) return grpc::Status::OK;
      return grpc::Status(tenant.status().code() == absl::StatusCode::kPermissionDenied
                              ? grpc::StatusCode::PERMISSION_DENIED
                              : grpc::StatusCode::UNAUTHENTICATED,
                          std::string(tenant.status().message()));
    };
  }
  return policy;  // fallback: PERMISSION_DENIED
}

}  // namespace

absl::StatusOr<std::unique_ptr<GenerationFront>> GenerationFront::Start(
    const ServerOptions& server, const HttpFlags& http, const ApiKeyFlags& keys,
    GenerationService* generation, const Tokenizer* tokenizer,
    const std::vector<grpc::Service*>& services, const std::string& label) {
  std::unique_ptr<GenerationFront> f(new GenerationFront);
  f->drain_timeout_s_ = server.drain_timeout_s;
  auto api_keys = ApiKeys::Start(keys, generation);
  if (!api_keys.ok()) return api_keys.status();
  f->keys_ = std::move(api_keys).value();
  auto running =
      StartGrpcServer(server, services, PublicPolicy(f->keys_ ? f->keys_->access() : nullptr));
  if (!running.ok()) return running.status();
  f->server_ = std::move(running).value();
  TLOG(INFO) << label << " serving on " << server.host << ":" << f->server_.port;
  auto api = HttpApi::Start(http, server, f->server_.server.get(), tokenizer,
                            generation->options().model_name, generation->options().max_model_len,
                            generation->http_hooks(), generation->access_control());
  if (!api.ok()) return api.status();
  f->http_ = std::move(api).value();
  return f;
}

void GenerationFront::DrainOnSignal(const sigset_t& signals, const std::function<int64_t()>& active,
                                    const std::function<void()>& start_drain) {
  tandem::DrainOnSignal(signals, server_.server.get(), absl::Seconds(drain_timeout_s_), active,
                        start_drain);
  if (http_ != nullptr) http_->Stop();
}

void GenerationFront::Shutdown() {
  server_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

}  // namespace tandem
