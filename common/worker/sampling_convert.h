#pragma once

#include "absl/status/statusor.h"
#include "common/engine/sampler/sampling_params.h"
#include "tandem/v1/sampling.pb.h"

namespace tandem {

// The engine's SamplingParams from the API message, with the API's defaults for unset fields
// (temperature 1, top_p 1, repetition_penalty 1, max_tokens 16). Range checks happen in
// ValidateSamplingParams (by the engine); this only rejects what cannot be represented.
absl::StatusOr<SamplingParams> SamplingParamsFromProto(const v1::SamplingParams& proto);

}  // namespace tandem
