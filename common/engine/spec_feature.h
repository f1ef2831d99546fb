#pragma once

#include <memory>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/engine/engine_feature.h"
#include "common/engine/spec/proposer.h"
#include "common/engine/spec_hooks.h"

namespace tandem {

// Speculative decoding inside the continuous batch (DESIGN §4, spec/README.md) as a feature:
// proposals for decoding sequences before the scheduler plans (the plan gives each 1 + k rows),
// verification of every sequence's 1 + k positions after the one forward pass, KV rollback of
// rejected positions, and per-sequence adaptive k. Without a proposer it does nothing.
class SpecFeature final : public EngineFeature {
 public:
  explicit SpecFeature(std::unique_ptr<Proposer> proposer) : proposer_(std::move(proposer)) {}
  const char* name() const override { return "speculative decoding"; }

  absl::Status OnAdmit(Sequence* seq, const EngineRequest& request) override;
  void BeforeSchedule() override;  // proposals
  bool Sample(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates) override;
  // A sequence with drafts is verified on the host (Sample); the others may sample on the device.
  bool OnDeviceSample(Sequence* seq, DeviceSampleRow* row) override {
    return seq->spec.draft.empty();
  }
  void OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* update) override;
  void AddStats(EngineStats* stats) const override;

  // Hears every verification (metrics); may be null, must outlive the engine.
  void set_hooks(SpecHooks* hooks) { hooks_ = hooks; }

 private:
  void Verify(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates);
  void Adapt(Sequence* seq, int32_t drafted, int32_t accepted);

  std::unique_ptr<Proposer> proposer_;
  SpecHooks* hooks_ = nullptr;
};

}  // namespace tandem
