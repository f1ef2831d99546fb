// Overlapped steps (README "Overlapped steps"): which steps may be left in flight, which plans
// may be made while one is, and collecting it.

#include "common/engine/engine.h"

#include "common/base/log.h"
#include "common/engine/engine_core.h"

namespace tandem {

bool Engine::AsyncSteps() const {
  const EngineCore& core = *core_;
  return core.options().async_scheduling && core.backend().SupportsAsyncSteps() &&
         core.options().spec.method == SpecOptions::Method::kNone;
}

bool Engine::OverlapSafe(const Sequence& seq) {
  // The next plan must not need the token on the host: no grammar mask to advance, no drafts to
  // propose from it, no penalties counting it, nothing forked from it, not the prefill role's
  // last token (its hold and export follow the token).
  const SamplingParams& p = seq.params;
  return seq.status == SeqStatus::kRunning && seq.spec.draft.empty() &&
         !seq.grammar.constrained() && seq.pending_forks == 0 && !seq.disagg.prefill_only &&
         p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f;
}

bool Engine::CanPlanAhead() const {
  for (const Sequence* seq : inflight_->sampled) {
    if (seq != nullptr && !OverlapSafe(*seq)) return false;
  }
  return true;
}

void Engine::CollectInflight(std::vector<SequenceUpdate>* updates) {
  std::unique_ptr<InflightStep> step = std::move(inflight_);
  EngineCore& core = *core_;
  std::vector<float> no_logits;
  const absl::Status st = step->sampling.Collect(core.backend(), &no_logits);
  if (!st.ok()) {
    FailSequences(st, step->scheduled, updates);
    return;
  }
  for (size_t i = 0; i < step->sampled.size(); ++i) {
    Sequence* seq = step->sampled[i];
    if (seq == nullptr || seq->status == SeqStatus::kFinished) continue;
    // A sequence preempted while its token was on the device (the plan that preempted it was
    // made before this) takes it as well: it recomputes from its tokens later.
    core.ResolvePendingToken(seq, *step->sampling.DeviceSampleOf(i),
                             &EngineCore::UpdateFor(seq, updates));
  }
}

void Engine::DropInflight(const std::string& request_id, int32_t index) {
  if (inflight_ == nullptr) return;
  auto matches = [&](const Sequence* seq) {
    return seq != nullptr && seq->request_id == request_id && (index < 0 || seq->index == index);
  };
  for (Sequence*& seq : inflight_->sampled) {
    if (!matches(seq)) continue;
    TANDEM_CHECK(seq->tokens.back() == kPendingToken);
    seq->tokens.pop_back();
    seq = nullptr;
  }
  for (Sequence*& seq : inflight_->scheduled) {
    if (matches(seq)) seq = nullptr;
  }
}

}  // namespace tandem
