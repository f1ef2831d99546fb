#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/engine/engine_feature.h"
#include "common/engine/lora/lora_registry.h"

namespace tandem {

// Multi-LoRA serving (README "LoRA"): a request names an adapter (EngineRequest::lora_name), and
// its sequences carry it (Sequence::lora) from admission to their end.
//   - Validate: the adapter is loaded (NOT_FOUND otherwise; INVALID_ARGUMENT without LoRA).
//   - OnAdmit: takes a reference on the adapter (unloading it never breaks the request) and
//     salts the sequence's block hashes with its cache key (SaltWithAdapter), before the
//     scheduler first looks the prompt up: KV computed under one adapter is never reused by
//     another or by the base model. At most max_loras distinct adapters have admitted requests
//     (so any batch mixes at most that many); a request for another adapter is held (kPending)
//     until one of them has no request left, then released in arrival order. Remote-prefill
//     requests (decode role) too: held before their reservation, their prefill has not begun
//     (a CUDA backend holds no more adapters than --max-loras, device_lora.h).
//   - BeforeForward: each scheduled sequence's adapter goes to the backend (ForwardSeq::lora),
//     which adds the low-rank terms grouped by adapter.
// Registered first (Engine::Create), so every later feature sees the salted hashes.
class LoraFeature : public EngineFeature {
 public:
  explicit LoraFeature(std::shared_ptr<LoraRegistry> registry);
  const char* name() const override { return "lora"; }

  absl::Status Validate(const EngineRequest& request) const override;
  absl::Status OnAdmit(Sequence* seq, const EngineRequest& request) override;
  void OnStepBegin(std::vector<SequenceUpdate>* updates) override;
  void BeforeForward(const SchedulerOutput& plan, const std::vector<Sequence*>& sampled,
                     ForwardBatch* batch) override;
  void OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* update) override;
  void AddStats(EngineStats* stats) const override;

 private:
  bool CanActivate(const LoraAdapter* adapter) const;
  void Activate(Sequence* seq);

  std::shared_ptr<LoraRegistry> registry_;  // null: LoRA is off
  int64_t max_loras_ = 0;
  // Requests admitted with an adapter (not held), and how many per adapter: the active set.
  std::unordered_map<std::string, const LoraAdapter*> requests_;
  std::map<const LoraAdapter*, int64_t> active_;
  std::deque<Sequence*> held_;  // waiting for an adapter slot, in arrival order
};

}  // namespace tandem
