#include "common/engine/sampler/device_sample.h"

#include <vector>

namespace tandem {

DeviceSample SampleRowOnHost(const DeviceSampleRow& row, const float* raw_logits,
                             int32_t vocab_size) {
  std::vector<float> l(raw_logits, raw_logits + vocab_size);
  ApplyLogitEdits(row.edits, l.data());
  ApplyTokenMask(row.mask, l.data(), vocab_size);
  SamplingParams p;
  p.temperature = row.temperature;
  p.top_k = row.top_k;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  DeviceSample out;
  out.token = SampleTokenWithUniform(p, l.data(), vocab_size, row.uniform);
  if (row.logprobs >= 0) {
    ComputeLogprobs(raw_logits, vocab_size, out.token, row.logprobs, &out.chosen, &out.top);
  }
  return out;
}

}  // namespace tandem
