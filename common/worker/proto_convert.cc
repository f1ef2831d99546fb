#include "common/worker/proto_convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<grammar::Constraint> ConstraintFromProto(const v1::OutputConstraint& p) {
  constexpr size_t kMaxText = 1 << 20;
  grammar::Constraint c;
  c.strict = !p.has_strict() || p.strict();
  auto text = [&](grammar::Constraint::Kind kind, const std::string& value,
                  const char* field) -> absl::Status {
    if (value.size() > kMaxText) {
      return absl::InvalidArgumentError(
          absl::StrCat("constraint.", field, ": longer than ", kMaxText, " bytes"));
    }
    c.kind = kind;
    c.value = value;
    return absl::OkStatus();
  };
  absl::Status st;
  switch (p.kind_case()) {
    case v1::OutputConstraint::kJsonSchema:
      st = text(grammar::Constraint::Kind::kJsonSchema, p.json_schema(), "json_schema");
      break;
    case v1::OutputConstraint::kRegex:
      st = text(grammar::Constraint::Kind::kRegex, p.regex(), "regex");
      break;
    case v1::OutputConstraint::kGrammar:
      st = text(grammar::Constraint::Kind::kGrammar, p.grammar(), "grammar");
      break;
    case v1::OutputConstraint::kJsonObject:
      if (p.json_object()) c.kind = grammar::Constraint::Kind::kJsonObject;
      break;
    case v1::OutputConstraint::kChoice: {
      if (p.choice().choices_size() == 0 || p.choice().choices_size() > 10000) {
        return absl::InvalidArgumentError("constraint.choice: 1 to 10000 strings");
      }
      c.kind = grammar::Constraint::Kind::kChoice;
      size_t total = 0;
      for (const std::string& s : p.choice().choices()) {
        total += s.size();
        if (s.empty()) return absl::InvalidArgumentError("constraint.choice: empty string");
        c.choices.push_back(s);
      }
      if (total > kMaxText) {
        return absl::InvalidArgumentError("constraint.choice: too long in all");
      }
      break;
    }
    case v1::OutputConstraint::KIND_NOT_SET:
      break;
  }
  if (!st.ok()) return st;
  return c;
}

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
  auto constraint = ConstraintFromProto(p.constraint());
  if (!constraint.ok()) return constraint.status();
  s.constraint = std::move(*constraint);
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
