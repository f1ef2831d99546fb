#pragma once

// Logits processing as data (README "Order of processing", step 1): the edits one row gets from
// its request's logit bias, min_tokens masking and penalties, built once on the host and applied
// either by the host sampler (ProcessLogits) or by a backend that samples on the device. The
// arithmetic of each edit is fixed here (ApplyLogitEdit), so both give the same bits.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/engine/sampler/sampling_params.h"

namespace tandem {

// A sequence's tokens as the penalties see them.
struct TokenHistory {
  absl::Span<const int32_t> prompt;
  absl::Span<const int32_t> output;
};

enum class LogitOp : int32_t {
  kAdd = 0,         // l + value (logit bias)
  kNegInf = 1,      // -inf (a stop id while fewer than min_tokens were generated)
  kRepetition = 2,  // l > 0 ? l / value : l * value (Hugging Face's repetition penalty)
  kSubtract = 3,    // l - value (presence + frequency x count, computed once per token)
};

struct LogitEdit {
  int32_t id = 0;
  LogitOp op = LogitOp::kAdd;
  float value = 0.0f;
};

// Edits in the order they apply, cut into phases: phase p is [phase_end[p - 1], phase_end[p])
// (phase 0 starts at 0) and touches each token at most once, so a phase may be applied in any
// order or in parallel; phases apply one after another.
struct LogitEdits {
  std::vector<LogitEdit> edits;
  std::vector<int32_t> phase_end;
  bool empty() const { return edits.empty(); }
};

// The edits of ProcessLogits for `params` and `history` (`stop_ids`: EOS and stop_token_ids,
// masked while fewer than min_tokens were generated). Ids outside [0, vocab_size) are skipped.
void BuildLogitEdits(const SamplingParams& params, const TokenHistory& history,
                     absl::Span<const int32_t> stop_ids, int32_t vocab_size, LogitEdits* edits);

inline float ApplyLogitEdit(LogitOp op, float value, float l) {
  switch (op) {
    case LogitOp::kAdd:
      return l + value;
    case LogitOp::kNegInf:
      return -__builtin_inff();
    case LogitOp::kRepetition:
      return l > 0 ? l / value : l * value;
    case LogitOp::kSubtract:
      return l - value;
  }
  return l;
}

void ApplyLogitEdits(const LogitEdits& edits, float* logits);

// A token mask as data (the grammar's, EngineFeature::OnLogits): tokens whose bit is clear in
// `allowed` (64 per word, token t in word t / 64, bit t % 64; tokens past the words are refused)
// become -inf; then each token of `revive` that is not finite becomes 0 (a sequence is never
// left without a choice).
struct TokenMaskEdit {
  std::vector<uint64_t> allowed;  // empty: no mask
  std::vector<int32_t> revive;
  bool empty() const { return allowed.empty(); }
};

void ApplyTokenMask(const TokenMaskEdit& mask, float* logits, int32_t vocab_size);

}  // namespace tandem
