#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/engine/sampler/logit_edits.h"
#include "common/engine/sampler/rng.h"
#include "common/engine/sampler/sampling_params.h"

namespace tandem {

// A normalised distribution over the tokens that survived filtering: sorted by descending
// probability (ties: lower token id first) when top-k, top-p or min-p cut it, else in id order
// (no sort needed). Tokens of probability 0 (masked) are left out. Used for sampling and for
// speculative verification.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<float> probs;
  float ProbOf(int32_t id) const;  // 0 when filtered out
};

// Order of logits processing (fixed, documented in README.md):
//   logit_bias -> min_tokens stop masking -> repetition / presence / frequency penalties
//   -> (greedy: argmax) | temperature -> top-k -> top-p -> min-p -> sample.
//
// Applies logit bias, stop-token masking while fewer than min_tokens were generated, and
// penalties, in place. `stop_ids` are the ids masked for min_tokens (EOS and stop_token_ids).
void ProcessLogits(const SamplingParams& params, const TokenHistory& history,
                   absl::Span<const int32_t> stop_ids, float* logits, int32_t vocab_size);

// Argmax; the lowest id wins ties.
int32_t GreedyToken(const float* logits, int32_t vocab_size);

// Temperature, top-k, top-p and min-p over processed logits. Requires temperature > 0.
TokenDistribution ComputeDistribution(const SamplingParams& params, const float* logits,
                                      int32_t vocab_size);

// Inverse-CDF draw over the distribution's order with one uniform from `rng` (or the uniform
// `u` in [0, 1) itself).
int32_t SampleFromDistribution(const TokenDistribution& dist, Rng& rng);
int32_t SampleFromDistribution(const TokenDistribution& dist, double u);

// Picks the next token: greedy when temperature == 0, else a draw from ComputeDistribution.
// `logits` must already be processed with ProcessLogits.
int32_t SampleToken(const SamplingParams& params, const float* logits, int32_t vocab_size,
                    Rng& rng);
// The same with the draw's uniform given (the one SampleToken takes from its generator when
// temperature > 0; greedy ignores it).
int32_t SampleTokenWithUniform(const SamplingParams& params, const float* logits,
                               int32_t vocab_size, double u);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// log_softmax of `logits` at `token` and the top-n entries (descending, ties by id).
void ComputeLogprobs(const float* logits, int32_t vocab_size, int32_t token, int32_t top_n,
                     TokenLogprob* chosen, std::vector<TokenLogprob>* top);

}  // namespace tandem
