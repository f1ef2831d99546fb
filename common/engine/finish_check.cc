#include "common/engine/finish_check.h"

#include <algorithm>

namespace tandem {

FinishDecision CheckFinish(const FinishCheckInput& in) {
  FinishDecision d;
  if (!in.verdict.error.ok()) {
    d.reason = FinishReason::kError;
    d.status = in.verdict.error;
  } else if (in.eos && (in.verdict.constrained || !in.ignore_eos)) {
    d.reason = FinishReason::kStop;
  } else if (std::find(in.stop_token_ids.begin(), in.stop_token_ids.end(), in.token) !=
             in.stop_token_ids.end()) {
    d.reason = FinishReason::kStop;
  } else if (in.verdict.complete) {
    d.reason = FinishReason::kStop;
  } else if (in.num_output >= in.max_tokens || in.num_tokens >= in.max_model_len) {
    d.reason = FinishReason::kLength;
  } else if (in.verdict.last_token) {
    d.reason = FinishReason::kStop;
  }
  return d;
}

}  // namespace tandem
