#pragma once

// Whether a sequence ends with the token just appended, and why: one pure function over what the
// engine and its features know after the append (README "Engine contract", step 5).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

// What the features say about the appended token (EngineFeature::OnToken fills it in).
struct TokenVerdict {
  absl::Status error;        // non-OK: the sequence fails with this status
  bool constrained = false;  // a constraint governs the output: an end-of-sequence token it let
                             // through ends the sequence even under ignore_eos
  bool complete = false;     // the constraint is complete and nothing may follow
  bool last_token = false;   // the role produces no more tokens (prefill: the first is all)
};

struct FinishCheckInput {
  int32_t token = 0;
  bool eos = false;  // the token is one of the model's end-of-sequence ids
  bool ignore_eos = false;
  absl::Span<const int32_t> stop_token_ids;
  int64_t num_output = 0;  // output tokens, the appended one included
  int64_t max_tokens = 0;
  int64_t num_tokens = 0;  // prompt and output
  int64_t max_model_len = 0;
  TokenVerdict verdict;
};

struct FinishDecision {
  FinishReason reason = FinishReason::kNone;  // kNone: the sequence goes on
  absl::Status status;                        // non-OK with kError
};

// In order of precedence: a feature's error (kError); an end-of-sequence token when the output is
// constrained or ignore_eos is off (kStop); a stop token id (kStop); a complete constraint
// (kStop); max_tokens or the context length reached (kLength); the role's last token (kStop).
FinishDecision CheckFinish(const FinishCheckInput& input);

}  // namespace tandem
