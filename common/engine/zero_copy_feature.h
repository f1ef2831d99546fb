#pragma once

#include <memory>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/engine/engine_feature.h"

namespace tandem {

// Zero-copy KV transfer, the prefill engine's side (kvtransfer/README.md "Zero-copy on one GPU";
// README "Zero-copy destinations"): a prefill-only request with EngineRequest::kv_destination
// computes its prompt straight into a decode worker's reserved blocks, in that worker's pool
// mapped into this process.
//   - Validate: the request is prefill-only, the backend takes remote pools
//     (Backend::SupportsRemoteKv), the pool has no window layout, and the destination covers
//     exactly the prompt's blocks from first_block on, inside its pool.
//   - OnAdmit: the destination's blocks become the sequence's table entries from first_block on
//     (SequenceBlocks::remote, tagged kKvRemoteBlock): the KV cache manager takes them instead
//     of allocating, never caches them and never frees them (preemption and aborts included).
//   - BeforeSchedule: one remote pool per step (ForwardBatch::remote_kv): the sequences of
//     other destinations than the first runnable one's in service order are held until the
//     next step (OnStepBegin releases them; the engine is woken so it steps again).
//   - BeforeForward: the step's pool goes to the backend, with a layer hook, so the backend
//     records its per-layer events after every chunk (a transport's ABORT waits for the latest
//     ones) and runs such steps eagerly and collected at once.
// Engine thread only.
class ZeroCopyFeature final : public EngineFeature {
 public:
  const char* name() const override { return "zero-copy"; }

  absl::Status Validate(const EngineRequest& request) const override;
  absl::Status OnAdmit(Sequence* seq, const EngineRequest& request) override;
  void OnStepBegin(std::vector<SequenceUpdate>* updates) override;
  void BeforeSchedule() override;
  void BeforeForward(const SchedulerOutput& plan, const std::vector<Sequence*>& sampled,
                     ForwardBatch* batch) override;
  void OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* update) override;

 private:
  // The destination pool of `seq` (null: none).
  const std::shared_ptr<const RemoteKvPool>* PoolOf(const Sequence& seq) const;

  int slot_ = -1;                // the sequences' destination (FeatureSlots)
  std::vector<Sequence*> held_;  // held for this step: another destination's turn
};

}  // namespace tandem
