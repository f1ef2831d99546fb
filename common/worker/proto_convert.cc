#include "common/worker/proto_convert.h"

#include <algorithm>

namespace tandem {

absl::StatusOr<SamplingParams> SamplingParamsFromProto(const v1::SamplingParams& p) {
  SamplingParams s;
  s.temperature = p.has_temperature() ? p.temperature() : 1.0f;
  s.top_k = p.top_k();
  s.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  s.min_p = p.min_p();
  s.repetition_penalty = p.has_repetition_penalty() ? p.repetition_penalty() : 1.0f;
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  if (p.logit_bias_size() > 1024) {
    return absl::InvalidArgumentError("logit_bias: at most 1024 entries");
  }
  for (const auto& [id, bias] : p.logit_bias()) s.logit_bias.emplace_back(id, bias);
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  if (p.has_seed()) s.seed = p.seed();
  s.max_tokens = p.has_max_tokens() ? p.max_tokens() : 16;
  s.min_tokens = p.min_tokens();
  s.ignore_eos = p.ignore_eos();
  if (p.stop_token_ids_size() > 1024) {
    return absl::InvalidArgumentError("stop_token_ids: at most 1024 entries");
  }
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.logprobs = p.has_logprobs() ? p.logprobs() : -1;
  if (p.has_speculative()) s.speculative = p.speculative();
  if (p.has_logprobs() && p.logprobs() < 0) {
    return absl::InvalidArgumentError("logprobs: must be in [0, 20]");
  }
  return s;
}

void LogprobsToProto(const TokenLogprobs& src, v1::TokenLogprobs* dst) {
  dst->mutable_chosen()->set_token_id(src.chosen.id);
  dst->mutable_chosen()->set_logprob(src.chosen.logprob);
  for (const TokenLogprob& top : src.top) {
    v1::TokenLogprob* e = dst->add_top();
    e->set_token_id(top.id);
    e->set_logprob(top.logprob);
  }
}

TokenLogprobs LogprobsFromProto(const v1::TokenLogprobs& lp) {
  TokenLogprobs t;
  t.chosen = {lp.chosen().token_id(), lp.chosen().logprob()};
  for (const v1::TokenLogprob& e : lp.top()) t.top.push_back({e.token_id(), e.logprob()});
  return t;
}

}  // namespace tandem
