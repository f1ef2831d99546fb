#include "common/engine/scheduler/batch_shape_policy.h"

#include <algorithm>

namespace tandem {

std::vector<Sequence*> RowOrder(const std::vector<Sequence*>& running) {
  std::vector<Sequence*> order;
  order.reserve(running.size());
  for (Sequence* seq : running) {
    if (!seq->is_prefill()) order.push_back(seq);
  }
  for (Sequence* seq : running) {
    if (seq->is_prefill()) order.push_back(seq);
  }
  return order;
}

DecodeRow ShapeDecode(int64_t num_uncomputed, int64_t num_drafts, int64_t budget_left) {
  DecodeRow row;
  row.num_new_tokens = std::min(num_uncomputed + num_drafts, budget_left);
  row.num_drafts = std::min(num_drafts, std::max<int64_t>(0, row.num_new_tokens - 1));
  return row;
}

int64_t ShapePrefillChunk(int64_t num_to_compute, int64_t budget_left, int64_t max_prefill_chunk) {
  const int64_t chunk = std::min(num_to_compute, budget_left);
  return max_prefill_chunk > 0 ? std::min(chunk, max_prefill_chunk) : chunk;
}

}  // namespace tandem
