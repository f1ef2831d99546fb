#pragma once

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/engine/sampler/sampling_params.h"
#include "tandem/v1/sampling.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// Conversions between the worker API's messages and the engine's types, shared by the roles.

// The engine's SamplingParams from the API message, with the API's defaults for unset fields
// (temperature 1, top_p 1, repetition_penalty 1, max_tokens 16). Range checks happen in
// ValidateSamplingParams (by the engine); this only rejects what cannot be represented.
absl::StatusOr<SamplingParams> SamplingParamsFromProto(const v1::SamplingParams& proto);
// The structured-output constraint (kind None when unset); oversized text is INVALID_ARGUMENT.
absl::StatusOr<grammar::Constraint> ConstraintFromProto(const v1::OutputConstraint& proto);

// The engine request of a DecodeRequest or PrefillRequest: the fields both carry (id, prompt,
// prior output, sampling, samples, priority, cache salt, tenant). Role-specific fields are the
// caller's.
template <class Request>
absl::StatusOr<EngineRequest> EngineRequestFromProto(const Request& request) {
  auto params = SamplingParamsFromProto(request.sampling());
  if (!params.ok()) return params.status();
  EngineRequest e;
  e.id = request.request_id();
  e.prompt.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  e.prior_output.assign(request.prior_output_token_ids().begin(),
                        request.prior_output_token_ids().end());
  e.params = std::move(params).value();
  e.n = request.n() == 0 ? 1 : request.n();
  e.priority = request.priority();
  e.cache_salt = request.cache_salt();
  e.tenant = request.tenant();
  e.lora_name = request.lora_name();
  e.arrival_time = absl::Now();
  return e;
}

// One token's logprobs (the chosen token's and the top alternatives) into `out`, appending the
// alternatives.
void LogprobsToProto(const TokenLogprobs& logprobs, v1::TokenLogprobs* out);
TokenLogprobs LogprobsFromProto(const v1::TokenLogprobs& proto);

}  // namespace tandem
