#pragma once

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/engine/engine_core.h"
#include "common/engine/engine_feature.h"
#include "common/grammar/compile_service.h"

namespace tandem {

// Structured output (DESIGN §4, common/grammar/README.md, engine README "Structured output") as
// a feature. Nothing a grammar costs runs unbounded on the engine loop:
//
// - Admission: the request's constraint goes to the compile service (EngineOptions::
//   grammar_service, its workers fair across tenants, each compile within a CPU budget) under
//   the request's tenant. A cached grammar is attached at once; otherwise the sequence waits
//   (Hold: kPending, no slot, no blocks) while the others keep stepping, and the step after the
//   compile ends attaches it (prior output replayed) or ends it with the compile's error.
// - Masks: before the plan each sequence that may be computed gets its token masks (the current
//   state's and each drafted state's) from its grammar's cache, or computed on the engine thread
//   within grammar_mask_inline_us of CPU time (and grammar_mask_step_us for the whole step). A
//   mask that needs more, or any uncached mask of a grammar one of whose masks needed more than
//   grammar_mask_inline_us, is computed on the service's workers (the tenant's turn,
//   the service's budget) while its sequence waits (kAwaiting: keeps its slot and blocks);
//   while such a computation holds a grammar, the other sequences on that grammar wait too (it
//   holds the grammar's state graph). Drafts are cut at their first forbidden token or missing
//   mask. The tokens are those of masks computed inline: greedy output is unchanged.
// - Tokens from elsewhere never make the loop wait for such a computation: a migrated request's
//   prior output is replayed once its grammar is free (the sequence waits, kGrammarBusy), and a
//   prefill worker's first token waits (ForeignTokenPending; DisaggFeature holds it).
// - Sampling: each logits row is masked before temperature / top-k / top-p, and every appended
//   token advances the matcher (a complete grammar with no continuation ends the sequence).
class GrammarFeature final : public EngineFeature {
 public:
  const char* name() const override { return "structured output"; }

  absl::Status OnAdmit(Sequence* seq, const EngineRequest& request) override;
  absl::Status CheckForeignToken(const Sequence& seq, int32_t token) const override;
  bool ForeignTokenPending(const Sequence& seq) const override;     // its grammar computing
  void OnStepBegin(std::vector<SequenceUpdate>* updates) override;  // waits end
  void BeforeSchedule() override;  // masks prepared or deferred, drafts kept inside the grammar
  void OnLogits(Sequence* seq, float* logits) override;
  bool OnDeviceSample(Sequence* seq, DeviceSampleRow* row) override;  // the mask as data
  void OnToken(Sequence* seq, int32_t token, bool eos, TokenVerdict* verdict) override;
  void OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* update) override;
  void AddStats(EngineStats* stats) const override;

 private:
  using Wait = GrammarState::Wait;

  TokenMaskEdit mask_;  // OnLogits scratch

  grammar::GrammarCompileService& service();
  // The grammar is ready for `seq`: its matcher, with the prior output replayed, or, while a
  // mask of that grammar is computed off the loop, `seq` waits (kGrammarBusy) to replay it.
  absl::Status Attach(Sequence* seq, std::shared_ptr<const grammar::CompiledGrammar> compiled);
  // Advances the matcher of `seq` over its prior output (INVALID_ARGUMENT: outside the grammar).
  absl::Status Replay(Sequence* seq);
  // A mask of `g` is being computed off the loop now: the worker holds its state graph, which
  // the engine thread must not touch (it would wait for the worker).
  bool Computing(const grammar::CompiledGrammar* g) const;
  // Makes `seq` wait (Scheduler::Hold) for `kind`.
  void StartWait(Sequence* seq, Wait kind);
  // Ends the wait of `seq` (releasing it in the scheduler when `release`).
  void StopWait(Sequence* seq, bool release);
  // Ends `seq` with `status` (OnStepBegin).
  void Fail(Sequence* seq, const absl::Status& status, std::vector<SequenceUpdate>* updates);
  // The mask OnLogits applies to `seq`'s next row: the grammar's allowed tokens, end-of-sequence
  // ids where the grammar is complete or nothing else fits (then revived when refused before).
  void BuildTokenMask(Sequence* seq, TokenMaskEdit* mask);
  // Fills seq->grammar.masks for this step (false: the current state's mask must be computed
  // off the loop) and cuts the drafts.
  bool PrepareMasks(Sequence* seq);
  // The mask of `matcher`'s state computed here within the inline budget, or null.
  std::shared_ptr<const grammar::TokenMask> InlineMask(grammar::GrammarMatcher& matcher);
  // Starts computing the current state's mask of `seq` on the service; `seq` waits for it.
  void DeferMask(Sequence* seq);

  std::shared_ptr<grammar::GrammarCompileService> service_;  // made at the first constraint
  std::vector<Sequence*> held_;                              // waiting for anything (wait set)
  // Mask computations in flight off the loop, per grammar: its sequences wait meanwhile.
  absl::flat_hash_map<const grammar::CompiledGrammar*, int32_t> busy_;
  int64_t step_inline_us_ = 0;  // CPU spent on masks on the engine thread in this step

  struct Counters {
    int64_t cache_hits = 0, compiled = 0, rejected = 0, invalid = 0, budget_exceeded = 0,
            cancelled = 0, masks_deferred = 0, mask_budget_exceeded = 0;
  } counters_;
};

}  // namespace tandem
