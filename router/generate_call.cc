#include "router/generate_call.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "router/finish_reason.h"
#include "router/request_decoding.h"

namespace tandem {
namespace {

// Prompt ids that prime a sample's detokenizer, so the continuation's first token is decoded in
// context (leading spaces, merged characters) without decoding the whole prompt.
constexpr size_t kDetokenizerContext = 8;

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

std::string SecondsSince(absl::Time start) {
  return absl::StrCat(absl::ToDoubleSeconds(absl::Now() - start));
}

}  // namespace

GenerateCall::GenerateCall(GenerationService* service, grpc::CallbackServerContext* context)
    : service_(service),
      context_(context),
      arrival_(absl::Now()),
      hooks_(service->NewRequestHooks(arrival_)) {}

const std::string& GenerateCall::TenantName() const {
  static const std::string kNoTenant;
  return tenant_ != nullptr ? tenant_->name : kNoTenant;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateCall::Start(
    GenerationService* service, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* raw_request) {
  std::shared_ptr<GenerateCall> call(new GenerateCall(service, context));
  call->self_ = call;
  service->CallStarted();
  v1::DecodeRequest decode;
  v1::GenerateRequest request;
  grpc::Status st = service->draining()
                        ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down")
                        : service->CheckAccess(context, &call->tenant_);
  // The key and the tenant's limits come before any work on the body (parsing, tokenizing).
  if (st.ok() && call->tenant_ != nullptr) {
    const absl::Status limits = service->access_control()->CheckLimits(*call->tenant_);
    if (!limits.ok()) {
      st =
          grpc::Status(static_cast<grpc::StatusCode>(limits.code()), std::string(limits.message()));
    }
  }
  if (st.ok()) st = ParseGenerateRequest(*raw_request, &request);
  if (st.ok()) st = call->Prepare(request, &decode);
  if (st.ok() && call->tenant_ != nullptr) {
    const absl::Status admit = service->access_control()->Admit(
        *call->tenant_, static_cast<int64_t>(call->prompt_ids_.size()));
    if (admit.ok()) {
      call->admitted_ = true;
    } else {
      st = grpc::Status(static_cast<grpc::StatusCode>(admit.code()), std::string(admit.message()));
    }
  }
  if (st.ok()) {
    if (call->hooks_ != nullptr) {
      call->hooks_->Start(decode.n(), static_cast<int64_t>(call->prompt_ids_.size()));
    }
    if (LogEnabled(LogLevel::kInfo)) {
      LogMessage(LogLevel::kInfo, __FILE__, __LINE__)
              .Field("event", "received")
              .Field("request_id", call->request_id_)
              .Field("worker_request_id", call->worker_id_)
              .Field("tenant", call->tenant_ != nullptr ? call->tenant_->name : "")
              .Field("prompt_tokens", absl::StrCat(call->prompt_ids_.size()))
              .Field("n", absl::StrCat(decode.n()))
              .Field("max_tokens", absl::StrCat(request.sampling().max_tokens()))
              .stream()
          << "request received";
    }
  }
  if (!st.ok()) {
    std::unique_lock<std::mutex> lock(call->mu_);
    call->FinishCall(lock, st);
    return call.get();
  }
  service->client().Decode(decode,
                           [call](const v1::DecodeResponse& r) { call->OnWorkerResponse(r); });
  return call.get();
}

grpc::Status GenerateCall::Prepare(const v1::GenerateRequest& r, v1::DecodeRequest* decode) {
  const GenerationServiceOptions& o = service_->options();
  if (grpc::Status st = service_->ResolveModel(r.model(), decode->mutable_lora_name()); !st.ok()) {
    return st;
  }
  if (!decode->lora_name().empty()) {
    decode->set_lora_path(service_->lora_catalog()->Path(decode->lora_name()));
  }
  const int32_t n = r.n() == 0 ? 1 : r.n();
  if (n < 1 || n > o.max_n) {
    return Invalid(absl::StrCat("n: must be in [1, ", o.max_n, "], got ", r.n()));
  }
  const v1::SamplingParams& s = r.sampling();
  if (s.stop_size() > o.max_stop_strings) {
    return Invalid(
        absl::StrCat("stop: at most ", o.max_stop_strings, " stop strings, got ", s.stop_size()));
  }
  for (const std::string& stop : s.stop()) {
    if (stop.empty() || static_cast<int32_t>(stop.size()) > o.max_stop_string_bytes) {
      return Invalid(absl::StrCat("stop: each stop string must have 1 to ", o.max_stop_string_bytes,
                                  " bytes"));
    }
  }
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (r.text().empty()) return Invalid("prompt: text must not be empty");
      if (static_cast<int32_t>(r.text().size()) > o.max_prompt_bytes) {
        return Invalid(absl::StrCat("prompt: text longer than ", o.max_prompt_bytes, " bytes"));
      }
      const bool add_special = r.has_add_special_tokens() ? r.add_special_tokens() : true;
      auto ids = service_->tokenizer().Encode(r.text(), add_special);
      if (!ids.ok()) return Invalid(absl::StrCat("prompt: ", ids.status().message()));
      prompt_ids_ = std::move(ids).value();
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = r.token_ids().ids();
      if (ids.empty()) return Invalid("prompt: token_ids must not be empty");
      const int32_t vocab = service_->tokenizer().vocab_size();
      for (int32_t id : ids) {
        if (id < 0 || id >= vocab) {
          return Invalid(
              absl::StrCat("prompt: token id ", id, " outside the vocabulary [0, ", vocab, ")"));
        }
      }
      prompt_ids_.assign(ids.begin(), ids.end());
      break;
    }
    default:
      return Invalid("prompt: set text or token_ids");
  }
  if (prompt_ids_.empty()) return Invalid("prompt: tokenizes to no tokens");

  // The workers know the call by a fresh random id of its own: a client-chosen id is unique
  // only within its tenant.
  worker_id_ = GenerationService::NewRequestId();
  if (r.request_id().empty()) {
    request_id_ = worker_id_;
  } else {
    request_id_ = r.request_id();
    if (!service_->ClaimRequestId(TenantName(), request_id_)) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrCat("request_id: '", request_id_, "' is already running"));
    }
    id_claimed_ = true;
  }
  echo_prompt_ids_ = r.echo_prompt_ids();
  skip_special_tokens_ = s.has_skip_special_tokens() ? s.skip_special_tokens() : true;
  samples_.resize(n);
  for (Sample& sample : samples_) {
    sample.decoder = std::make_unique<StreamDecoder>(service_->tokenizer(), skip_special_tokens_);
    const size_t from =
        prompt_ids_.size() > kDetokenizerContext ? prompt_ids_.size() - kDetokenizerContext : 0;
    for (size_t i = from; i < prompt_ids_.size(); ++i) sample.decoder->Step(prompt_ids_[i]);
    sample.stop = std::make_unique<StopMatcher>(
        std::vector<std::string>(s.stop().begin(), s.stop().end()), s.include_stop_str_in_output());
  }
  samples_open_ = n;

  decode->set_request_id(worker_id_);
  decode->mutable_prompt_token_ids()->Assign(prompt_ids_.begin(), prompt_ids_.end());
  *decode->mutable_sampling() = s;
  decode->set_n(n);
  decode->set_priority(r.priority());
  decode->set_tenant(TenantName());  // the workers' grammar work is shared fairly by tenant
  // A tenant's requests share cached prefixes only among themselves (and never time another
  // tenant's): its name leads the salt the block hashes are keyed with.
  decode->set_cache_salt(tenant_ != nullptr
                             ? absl::StrCat("tenant\x1f", tenant_->name, "\x1f", r.cache_salt())
                             : r.cache_salt());
  return grpc::Status::OK;
}

void GenerateCall::OnWorkerResponse(const v1::DecodeResponse& response) {
  if (response.has_tokens()) {
    HandleTokens(response.tokens());
  } else if (response.has_final()) {
    HandleFinal(response.final());
  }
}

void GenerateCall::HandleTokens(const v1::SampleTokens& t) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finish_status_.has_value() || t.index() < 0 ||
      t.index() >= static_cast<int32_t>(samples_.size())) {
    return;
  }
  Sample& sample = samples_[t.index()];
  if (sample.done || sample.stopped_by_string) return;
  v1::GenerateResponse out;
  v1::TokenChunk* chunk = out.mutable_chunk();
  chunk->set_index(t.index());
  std::string text;
  for (int i = 0; i < t.token_ids_size(); ++i) {
    const int32_t id = t.token_ids(i);
    chunk->add_token_ids(id);
    if (i < t.logprobs_size()) *chunk->add_logprobs() = t.logprobs(i);
    ++sample.tokens;
    if (auto piece = sample.decoder->Step(id); piece.has_value()) {
      text += sample.stop->Feed(*piece);
    }
    if (sample.stop->stopped()) break;  // tokens after the stop string are dropped
  }
  chunk->set_text(std::move(text));
  if (hooks_ != nullptr && chunk->token_ids_size() > 0) {
    const bool first = hooks_->time_to_first_token() == absl::ZeroDuration();
    hooks_->OnTokens(t.index(), chunk->token_ids_size());
    if (first && LogEnabled(LogLevel::kDebug)) {
      LogMessage(LogLevel::kDebug, __FILE__, __LINE__)
              .Field("event", "first_token")
              .Field("request_id", request_id_)
              .Field("ttft_s", absl::StrCat(absl::ToDoubleSeconds(hooks_->time_to_first_token())))
              .stream()
          << "first token";
    }
  }
  if (sample.stop->stopped()) {
    sample.stopped_by_string = true;
    service_->client().Cancel(worker_id_, t.index());
  }
  Enqueue(lock, std::move(out));
}

void GenerateCall::HandleFinal(const v1::SampleFinal& f) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finish_status_.has_value()) return;
  if (f.finish_reason() == v1::FINISH_REASON_ERROR) {
    // A rejected request or a failed sample ends the whole stream with the worker's status.
    if (samples_open_ > 1) service_->client().Cancel(worker_id_, -1);
    const int code = f.error_code() != 0 ? f.error_code() : grpc::StatusCode::INTERNAL;
    last_finish_reason_ = "error";
    FinishCall(lock, grpc::Status(static_cast<grpc::StatusCode>(code), f.error_message()));
    return;
  }
  if (f.index() < 0 || f.index() >= static_cast<int32_t>(samples_.size())) return;
  Sample& sample = samples_[f.index()];
  if (sample.done) return;
  sample.done = true;
  --samples_open_;
  last_finish_reason_ = sample.stopped_by_string ? "stop" : FinishReasonLabel(f.finish_reason());

  std::string tail = sample.stop->Flush();
  if (!tail.empty()) {
    v1::GenerateResponse out;
    out.mutable_chunk()->set_index(f.index());
    out.mutable_chunk()->set_text(std::move(tail));
    Enqueue(lock, std::move(out));
  }
  v1::GenerateResponse out;
  v1::GenerateFinal* final = out.mutable_final();
  final->set_index(f.index());
  *final->mutable_usage() = f.usage();
  *final->mutable_timings() = f.timings();
  if (sample.stopped_by_string) {
    final->set_finish_reason(v1::FINISH_REASON_STOP);
    final->set_stop_string(sample.stop->matched());
    final->mutable_usage()->set_completion_tokens(sample.tokens);
  } else {
    final->set_finish_reason(f.finish_reason());
  }
  Enqueue(lock, std::move(out));
  if (samples_open_ == 0) {
    const bool aborted = f.finish_reason() == v1::FINISH_REASON_ABORT && !sample.stopped_by_string;
    FinishCall(lock, aborted && context_->IsCancelled()
                         ? grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")
                         : grpc::Status::OK);
  }
}

void GenerateCall::Enqueue(std::unique_lock<std::mutex>& lock, v1::GenerateResponse message) {
  if (writes_.finish_called()) return;
  message.set_request_id(request_id_);
  if (!sent_first_) {
    sent_first_ = true;
    if (echo_prompt_ids_) {
      message.mutable_prompt_token_ids()->Assign(prompt_ids_.begin(), prompt_ids_.end());
    }
  }
  writes_.Push(std::move(message));
  PumpLocked(lock);
}

void GenerateCall::FinishCall(std::unique_lock<std::mutex>& lock, grpc::Status status) {
  SetFinishStatusLocked(std::move(status));
  PumpLocked(lock);
}

void GenerateCall::SetFinishStatusLocked(grpc::Status status) {
  if (finish_status_.has_value()) return;
  if (admitted_) {
    admitted_ = false;
    int64_t generated = 0;
    for (const Sample& s : samples_) generated += s.tokens;
    service_->access_control()->Release(*tenant_, generated);
  }
  const RequestOutcome outcome =
      OutcomeForStatusCode(static_cast<absl::StatusCode>(status.error_code()));
  if (hooks_ != nullptr) hooks_->Finish(outcome, last_finish_reason_);
  const LogLevel level = outcome == RequestOutcome::kError || outcome == RequestOutcome::kTimeout
                             ? LogLevel::kWarning
                             : LogLevel::kInfo;
  if (LogEnabled(level)) {
    int64_t tokens = 0;
    for (const Sample& s : samples_) tokens += s.tokens;
    LogMessage log(level, __FILE__, __LINE__);
    log.Field("event", "finished")
        .Field("request_id", request_id_)
        .Field("worker_request_id", worker_id_)
        .Field("outcome", RequestOutcomeName(outcome))
        .Field("finish_reason", last_finish_reason_.empty() ? "none" : last_finish_reason_)
        .Field("code", absl::StrCat(static_cast<int>(status.error_code())))
        .Field("prompt_tokens", absl::StrCat(prompt_ids_.size()))
        .Field("completion_tokens", absl::StrCat(tokens))
        .Field("e2e_s", SecondsSince(arrival_));
    if (hooks_ != nullptr && hooks_->time_to_first_token() > absl::ZeroDuration()) {
      log.Field("ttft_s", absl::StrCat(absl::ToDoubleSeconds(hooks_->time_to_first_token())));
    }
    log.stream() << "request finished";
    if (!status.ok()) log.stream() << ": " << status.error_message();
  }
  finish_status_ = std::move(status);
}

void GenerateCall::PumpLocked(std::unique_lock<std::mutex>& lock) {
  writes_.Pump(this, lock, finish_status_);
}

void GenerateCall::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  writes_.WriteDone();
  if (!ok) {
    // The client went away: stop generating and end the call.
    writes_.Clear();
    if (samples_open_ > 0) service_->client().Cancel(worker_id_, -1);
    SetFinishStatusLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
  }
  PumpLocked(lock);
}

void GenerateCall::OnCancel() {
  std::unique_lock<std::mutex> lock(mu_);
  if (samples_open_ > 0 && !worker_id_.empty()) service_->client().Cancel(worker_id_, -1);
  writes_.Clear();
  SetFinishStatusLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  PumpLocked(lock);
}

void GenerateCall::OnDone() {
  service_->CallEnded();
  std::shared_ptr<GenerateCall> self;
  {
    std::lock_guard<std::mutex> lock(mu_);
    self.swap(self_);
    if (id_claimed_) service_->ReleaseRequestId(TenantName(), request_id_);
    id_claimed_ = false;
  }
  // `self` goes out of scope here; worker callbacks may still hold references and will find
  // finish_status_ set.
}

}  // namespace tandem
