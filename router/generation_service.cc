#include "router/generation_service.h"

#include "absl/strings/str_cat.h"
#include "router/generate_call.h"
#include "router/http/request_id.h"
#include "router/request_decoding.h"

namespace tandem {

GenerationService::GenerationService(const GenerationServiceOptions& options,
                                     const Tokenizer* tokenizer, InferenceClient* client,
                                     RequestHooksFactory* hooks)
    : options_(options), tokenizer_(tokenizer), client_(client), hooks_(hooks) {}

std::string GenerationService::NewRequestId() { return RandomRequestId("req-"); }

grpc::Status GenerationService::CheckAccess(const grpc::CallbackServerContext* context,
                                            std::shared_ptr<const Tenant>* tenant) const {
  if (access_ == nullptr) return grpc::Status::OK;
  auto t = access_->Authenticate(context->client_metadata());
  if (!t.ok()) {
    return grpc::Status(t.status().code() == absl::StatusCode::kPermissionDenied
                            ? grpc::StatusCode::PERMISSION_DENIED
                            : grpc::StatusCode::UNAUTHENTICATED,
                        std::string(t.status().message()));
  }
  if (tenant != nullptr) *tenant = std::move(t).value();
  return grpc::Status::OK;
}

grpc::Status GenerationService::ResolveModel(const std::string& model,
                                             std::string* lora_name) const {
  lora_name->clear();
  if (model.empty() || model == options_.model_name) return grpc::Status::OK;
  if (lora_ != nullptr && lora_->Has(model)) {
    *lora_name = model;
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::NOT_FOUND,
                      absl::StrCat("model: '", model, "' is not served"));
}

bool GenerationService::ClaimRequestId(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(ids_mu_);
  return active_ids_.emplace(tenant, id).second;
}

void GenerationService::ReleaseRequestId(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(ids_mu_);
  active_ids_.erase(std::make_pair(tenant, id));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  return GenerateCall::Start(this, context, raw);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* raw,
                                                      grpc::ByteBuffer* raw_response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::TokenizeRequest parsed;
  if (grpc::Status st = CheckAccess(context, nullptr); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  if (grpc::Status st = ParseTokenizeRequest(*raw, &parsed); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  const v1::TokenizeRequest* request = &parsed;
  v1::TokenizeResponse response_message;
  v1::TokenizeResponse* response = &response_message;
  std::string lora_name;  // an adapter tokenizes as its base model
  if (grpc::Status st = ResolveModel(request->model(), &lora_name); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  if (static_cast<int64_t>(request->text().size()) > options_.max_prompt_bytes) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("text: longer than ", options_.max_prompt_bytes, " bytes")));
    return reactor;
  }
  auto ids = tokenizer_->Encode(
      request->text(), request->has_add_special_tokens() ? request->add_special_tokens() : true);
  if (!ids.ok()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("text: ", ids.status().message())));
    return reactor;
  }
  for (int32_t id : *ids) {
    response->add_token_ids(id);
    response->add_tokens(std::string(tokenizer_->IdToToken(id)));
  }
  *raw_response = SerializeToByteBuffer(response_message);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::ListModels(grpc::CallbackServerContext* context,
                                                        const v1::ListModelsRequest* request,
                                                        v1::ListModelsResponse* response) {
  if (grpc::Status st = CheckAccess(context, nullptr); !st.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(st);
    return reactor;
  }
  v1::ModelInfo* m = response->add_models();
  m->set_name(options_.model_name);
  m->set_architecture(options_.architecture);
  m->set_max_model_len(options_.max_model_len);
  m->set_vocab_size(tokenizer_->vocab_size());
  m->set_dtype(options_.dtype);
  if (lora_ != nullptr) {  // adapters, with the base model as their parent (vLLM's listing)
    for (const LoraCatalog::Entry& e : lora_->List()) {
      v1::ModelInfo* a = response->add_models();
      *a = *m;
      a->set_name(e.name);
      a->set_parent(options_.model_name);
      a->set_root(e.path);
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
