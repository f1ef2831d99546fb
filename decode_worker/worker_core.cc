#include "decode_worker/worker_core.h"

#include "decode_worker/sampling_convert.h"

namespace tandem {
namespace {

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return v1::FINISH_REASON_ABORT;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToProto(const SequenceUpdate& u, std::vector<v1::DecodeResponse>* out) {
  if (!u.new_tokens.empty()) {
    v1::DecodeResponse r;
    v1::SampleTokens* t = r.mutable_tokens();
    t->set_index(u.index);
    for (size_t i = 0; i < u.new_tokens.size(); ++i) {
      t->add_token_ids(u.new_tokens[i]);
      if (i < u.logprobs.size()) {
        v1::TokenLogprobs* lp = t->add_logprobs();
        lp->mutable_chosen()->set_token_id(u.logprobs[i].chosen.id);
        lp->mutable_chosen()->set_logprob(u.logprobs[i].chosen.logprob);
        for (const TokenLogprob& top : u.logprobs[i].top) {
          v1::TokenLogprob* e = lp->add_top();
          e->set_token_id(top.id);
          e->set_logprob(top.logprob);
        }
      }
    }
    out->push_back(std::move(r));
  }
  if (u.finished) {
    v1::DecodeResponse r;
    v1::SampleFinal* f = r.mutable_final();
    f->set_index(u.index);
    f->set_finish_reason(ToProto(u.finish_reason));
    f->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(u.prompt_tokens));
    f->mutable_usage()->set_completion_tokens(static_cast<int32_t>(u.completion_tokens));
    f->mutable_usage()->set_cached_tokens(static_cast<int32_t>(u.cached_tokens));
    f->mutable_timings()->set_queue_s(absl::ToDoubleSeconds(u.queue_time));
    f->mutable_timings()->set_prefill_s(absl::ToDoubleSeconds(u.prefill_time));
    f->mutable_timings()->set_time_to_first_token_s(absl::ToDoubleSeconds(u.ttft));
    f->mutable_timings()->set_total_s(absl::ToDoubleSeconds(u.total_time));
    if (!u.status.ok()) {
      f->set_error_code(static_cast<int32_t>(u.status.code()));
      f->set_error_message(std::string(u.status.message()));
    }
    out->push_back(std::move(r));
  }
}

}  // namespace

void WorkerCore::Decode(const v1::DecodeRequest& request, ResponseCallback callback) {
  auto params = SamplingParamsFromProto(request.sampling());
  if (!params.ok()) {
    v1::DecodeResponse r;
    r.mutable_final()->set_finish_reason(v1::FINISH_REASON_ERROR);
    r.mutable_final()->set_error_code(static_cast<int32_t>(params.status().code()));
    r.mutable_final()->set_error_message(std::string(params.status().message()));
    callback(r);
    return;
  }
  EngineRequest e;
  e.id = request.request_id();
  e.prompt.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  e.params = std::move(params).value();
  e.n = request.n() == 0 ? 1 : request.n();
  e.priority = request.priority();
  e.cache_salt = request.cache_salt();
  e.arrival_time = absl::Now();
  engine_->Submit(std::move(e), [callback = std::move(callback)](const SequenceUpdate& u) {
    std::vector<v1::DecodeResponse> out;
    ToProto(u, &out);
    for (const auto& r : out) callback(r);
  });
}

void WorkerCore::Cancel(const std::string& request_id, int32_t index) {
  if (index < 0) {
    engine_->Cancel(request_id);
  } else {
    engine_->FinishSequence(request_id, index, FinishReason::kAbort);
  }
}

v1::WorkerStats WorkerCore::Stats() const {
  EngineStats s = engine_->stats();
  v1::WorkerStats out;
  out.set_running(s.num_running);
  out.set_waiting(s.num_waiting);
  out.set_kv_blocks_total(s.kv_blocks_total);
  out.set_kv_blocks_used(s.kv_blocks_used);
  out.set_kv_blocks_cached(s.kv_blocks_cached);
  out.set_prompt_tokens(s.prompt_tokens);
  out.set_generated_tokens(s.generated_tokens);
  out.set_prefix_cache_queried_tokens(s.prefix_cache_queried);
  out.set_prefix_cache_hit_tokens(s.prefix_cache_hit);
  out.set_preemptions(s.preemptions);
  out.set_steps(s.steps);
  return out;
}

}  // namespace tandem
