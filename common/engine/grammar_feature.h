#pragma once

#include <functional>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/engine/engine_feature.h"

namespace tandem {

// Structured output (DESIGN §4, common/grammar/README.md) as a feature: a request's constraint
// is compiled at admission (EngineOptions::grammar; prior output replayed into the matcher),
// speculative drafts are cut at their first forbidden token before the scheduler plans, masks
// not in the grammar's cache are computed on a worker thread while the forward pass runs, each
// logits row is masked before temperature / top-k / top-p, and every appended token advances
// the matcher (a complete grammar with no continuation ends the sequence).
class GrammarFeature final : public EngineFeature {
 public:
  const char* name() const override { return "structured output"; }

  absl::Status OnAdmit(Sequence* seq, const EngineRequest& request) override;
  absl::Status CheckForeignToken(const Sequence& seq, int32_t token) const override;
  void BeforeSchedule() override;  // drafts kept inside the grammar
  void BeforeForward(const SchedulerOutput& plan, const std::vector<Sequence*>& sampled,
                     ForwardBatch* batch) override;  // masks start
  void AfterForward() override;                      // masks joined
  void OnLogits(Sequence* seq, float* logits) override;
  void OnToken(Sequence* seq, int32_t token, bool eos, TokenVerdict* verdict) override;

 private:
  std::function<void()> join_masks_;
};

}  // namespace tandem
