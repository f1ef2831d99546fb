#pragma once

// What a backend that samples on the device (Backend::ForwardSampled) is asked for one logits
// row and what it answers: the row's processing as data (logit edits, token mask), the cuts, the
// draw's uniform and the logprobs wanted. SampleRowOnHost is the host sampler run on that data:
// the reference a device sampler is checked against (greedy: the same token; a draw: the same
// distribution, and the same token except within rounding of a boundary of the cumulative sum).

#include <cstdint>
#include <vector>

#include "common/engine/sampler/logit_edits.h"
#include "common/engine/sampler/sampler.h"

namespace tandem {

struct DeviceSampleRow {
  int32_t logit_row = 0;     // index into ForwardBatch::logit_rows
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double uniform = 0.0;   // the draw's uniform in [0, 1) (temperature > 0)
  LogitEdits edits;       // bias, min_tokens masking, penalties
  TokenMaskEdit mask;     // the grammar's, after the edits
  int32_t logprobs = -1;  // -1: none; n >= 0: the chosen token's and the top n of the raw row
};

struct DeviceSample {
  int32_t token = 0;
  TokenLogprob chosen;            // when logprobs >= 0
  std::vector<TokenLogprob> top;  // the top `logprobs`, descending, ties by id
};

// Most logprobs a device sampler returns per row (ValidateSamplingParams' bound).
inline constexpr int32_t kMaxDeviceLogprobs = 20;

// The host sampler over `row` for `raw_logits` (vocab_size floats, not changed).
DeviceSample SampleRowOnHost(const DeviceSampleRow& row, const float* raw_logits,
                             int32_t vocab_size);

}  // namespace tandem
