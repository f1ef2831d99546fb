#include "common/engine/scheduler/sequence.h"

namespace tandem {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

std::unique_ptr<Sequence> ForkSample(const Sequence& parent, int64_t seq_id, int32_t index) {
  auto child = std::make_unique<Sequence>();
  child->seq_id = seq_id;
  child->arrival_order = parent.arrival_order;
  child->request_id = parent.request_id;
  child->index = index;
  child->priority = parent.priority;
  child->tokens = parent.tokens;
  child->prompt_len = parent.prompt_len;
  child->num_computed = parent.num_computed;
  child->params = parent.params;
  child->spec = parent.spec;
  child->grammar = parent.grammar;
  child->disagg = parent.disagg;
  child->lora = parent.lora;
  child->timing = parent.timing;
  child->usage = parent.usage.ForkedSample();
  child->features = parent.features;
  return child;
}

}  // namespace tandem
