#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"

#include "common/metrics/request_hooks.h"
#include "common/tokenizer/tokenizer.h"
#include "router/access_control.h"
#include "router/inference_client.h"
#include "router/lora_catalog.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {

struct GenerationServiceOptions {
  std::string model_name = "default";
  std::string architecture;
  int32_t max_model_len = 0;
  std::string dtype;
  int32_t max_stop_strings = 16;
  int32_t max_stop_string_bytes = 256;
  int32_t max_prompt_bytes = 1 << 20;
  int32_t max_n = 16;
};

// The client-facing gRPC API (service tandem.v1.Generation): tokenizes prompts, sends them to
// an InferenceClient, detokenizes the token stream incrementally, applies stop strings and
// streams responses. Thread-safe; every call runs on gRPC's callback threads and the client's
// callback threads.
// Generate and Tokenize take raw bytes (see request_decoding.h) so that malformed requests get a
// precise INVALID_ARGUMENT.
using GenerationServiceBase = v1::Generation::WithRawCallbackMethod_Generate<
    v1::Generation::WithRawCallbackMethod_Tokenize<v1::Generation::CallbackService>>;

class GenerationService final : public GenerationServiceBase {
 public:
  // `hooks` (may be null, must outlive this) follows every Generate call: metrics.
  GenerationService(const GenerationServiceOptions& options, const Tokenizer* tokenizer,
                    InferenceClient* client, RequestHooksFactory* hooks = nullptr);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

  // From now on new Generate calls fail with UNAVAILABLE; in-flight ones continue.
  void StartDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  int64_t active_calls() const { return active_.load(); }

  // Called by GenerateCall.
  const GenerationServiceOptions& options() const { return options_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  InferenceClient& client() { return *client_; }
  // A fresh unpredictable id ("req-" and 128 random bits): the id of a call that names none,
  // and the id every call is known by on the workers (router/http/request_id.h).
  static std::string NewRequestId();
  // Client-chosen request ids of the calls in flight, scoped by tenant ("" without API keys):
  // a call claims (tenant, id) before it reaches the client and releases it when it ends, so a
  // second call of the same tenant with the same id is refused (ALREADY_EXISTS) here and never
  // reaches, nor cancels, the request that owns the id. Another tenant's ids are invisible: the
  // same id is free for each tenant, and workers never see client ids (each call sends its own
  // NewRequestId), so no tenant can detect, squat or cancel another's request by its id.
  bool ClaimRequestId(const std::string& tenant, const std::string& id);
  void ReleaseRequestId(const std::string& tenant, const std::string& id);
  // Hooks for a call that arrived at `arrival`, or null without a factory.
  std::unique_ptr<RequestHooks> NewRequestHooks(absl::Time arrival) {
    return hooks_ != nullptr ? hooks_->NewRequest(arrival) : nullptr;
  }
  // The HTTP API's transport metrics, or null.
  HttpHooks* http_hooks() const { return hooks_ != nullptr ? hooks_->http_hooks() : nullptr; }
  void CallStarted() { active_.fetch_add(1); }
  // API keys and tenant limits (null: open access). Must outlive the service.
  void set_access_control(AccessControl* access) { access_ = access; }
  AccessControl* access_control() const { return access_; }
  // OK without access control; else UNAUTHENTICATED unless the call carries a valid key.
  grpc::Status CheckAccess(const grpc::CallbackServerContext* context,
                           std::shared_ptr<const Tenant>* tenant) const;
  void CallEnded() { active_.fetch_sub(1); }
  // LoRA adapters clients may name in `model` (null: none). Must outlive the service.
  void set_lora_catalog(LoraCatalog* catalog) { lora_ = catalog; }
  LoraCatalog* lora_catalog() const { return lora_; }
  // What `model` selects: OK with the adapter's name in `lora_name` (empty: the base model, for
  // an empty `model` or the served model's name); NOT_FOUND for any other name.
  grpc::Status ResolveModel(const std::string& model, std::string* lora_name) const;

 private:
  GenerationServiceOptions options_;
  const Tokenizer* tokenizer_;
  InferenceClient* client_;
  RequestHooksFactory* hooks_;
  AccessControl* access_ = nullptr;
  LoraCatalog* lora_ = nullptr;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};
  std::mutex ids_mu_;
  absl::flat_hash_set<std::pair<std::string, std::string>> active_ids_;  // (tenant, client id)
};

}  // namespace tandem
