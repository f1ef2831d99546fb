#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/grammar/constraint.h"

namespace tandem {

// Per-request sampling and stopping parameters (DESIGN §4 "Sampling"). Defaults give greedy
// decoding to max_tokens or end of sequence.
struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax); must be >= 0
  int32_t top_k = 0;                // 0: disabled; else keep the k most likely tokens
  float top_p = 1.0f;               // (0, 1]; 1: disabled
  float min_p = 0.0f;               // [0, 1]; drop tokens with p < min_p * p_max
  float repetition_penalty = 1.0f;  // > 0; HF semantics over prompt and output tokens
  float presence_penalty = 0.0f;    // [-2, 2]; OpenAI semantics over output tokens
  float frequency_penalty = 0.0f;   // [-2, 2]; OpenAI semantics over output tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits before penalties
  std::optional<uint64_t> seed;         // same seed, same output; unset: drawn at admission
  int32_t max_tokens = 16;              // new tokens at most (>= 1)
  int32_t min_tokens = 0;               // stop tokens are masked until this many were generated
  bool ignore_eos = false;              // do not stop on the model's end-of-sequence tokens
  std::vector<int32_t> stop_token_ids;  // stop after emitting any of these (included in output)
  std::vector<std::string> stop;        // stop strings (matched on detokenized text by callers)
  int32_t logprobs = -1;                // -1: none; n >= 0: the sampled token's and top-n logprobs
  std::optional<bool> speculative;      // per-request switch; unset: the server's setting
  // Structured output: the output must match this (JSON Schema, regex, grammar, ...); tokens it
  // forbids are masked before temperature/top-k/top-p (common/grammar).
  grammar::Constraint constraint;

  bool greedy() const { return temperature == 0.0f; }
};

// Checks every field's range against a vocabulary; errors are INVALID_ARGUMENT naming the field.
absl::Status ValidateSamplingParams(const SamplingParams& params, int32_t vocab_size);

}  // namespace tandem
