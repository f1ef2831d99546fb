#include "common/engine/lora_feature.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cluster/block_hash.h"
#include "common/engine/engine_core.h"

namespace tandem {

LoraFeature::LoraFeature(std::shared_ptr<LoraRegistry> registry)
    : registry_(std::move(registry)),
      max_loras_(registry_ != nullptr ? registry_->options().max_loras : 0) {}

absl::Status LoraFeature::Validate(const EngineRequest& r) const {
  if (r.lora_name.empty()) return absl::OkStatus();
  if (registry_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: '", r.lora_name, "' names a LoRA adapter but LoRA is not enabled (--enable-lora)"));
  }
  if (registry_->Find(r.lora_name) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model: LoRA adapter '", r.lora_name, "' is not loaded"));
  }
  return absl::OkStatus();
}

absl::Status LoraFeature::OnAdmit(Sequence* seq, const EngineRequest& r) {
  if (r.lora_name.empty()) return absl::OkStatus();
  std::shared_ptr<const LoraAdapter> adapter =
      registry_ != nullptr ? registry_->Find(r.lora_name) : nullptr;
  if (adapter == nullptr) {  // unloaded since Validate
    return absl::NotFoundError(
        absl::StrCat("model: LoRA adapter '", r.lora_name, "' is not loaded"));
  }
  seq->lora.adapter = std::move(adapter);
  seq->blocks.salt_hash = SaltWithAdapter(seq->blocks.salt_hash, seq->lora.adapter->cache_key);
  if (CanActivate(seq->lora.adapter.get())) {
    Activate(seq);
  } else {
    seq->lora.held = true;
    core().scheduler().Hold(seq);
    held_.push_back(seq);
  }
  return absl::OkStatus();
}

bool LoraFeature::CanActivate(const LoraAdapter* adapter) const {
  return active_.count(adapter) != 0 || static_cast<int64_t>(active_.size()) < max_loras_;
}

void LoraFeature::Activate(Sequence* seq) {
  const LoraAdapter* a = seq->lora.adapter.get();
  requests_[seq->request_id] = a;
  ++active_[a];
}

void LoraFeature::OnStepBegin(std::vector<SequenceUpdate>* updates) {
  for (auto it = held_.begin(); it != held_.end();) {
    Sequence* seq = *it;
    if (!CanActivate(seq->lora.adapter.get())) {
      ++it;
      continue;
    }
    Activate(seq);
    seq->lora.held = false;
    core().scheduler().Release(seq);
    it = held_.erase(it);
  }
}

void LoraFeature::BeforeForward(const SchedulerOutput& plan, const std::vector<Sequence*>& sampled,
                                ForwardBatch* batch) {
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    batch->seqs[i].lora = plan.scheduled[i].seq->lora.adapter.get();
  }
}

void LoraFeature::OnFinish(Sequence* seq, FinishReason reason, SequenceUpdate* update) {
  if (seq->lora.adapter == nullptr) return;
  update->lora_name = seq->lora.adapter->name;
  if (seq->lora.held) {  // ended while waiting for a slot (aborted)
    held_.erase(std::remove(held_.begin(), held_.end(), seq), held_.end());
    seq->lora.held = false;
    return;
  }
  // The request keeps its slot while another of its samples lives (or is still to be forked).
  if (const EngineCore::Samples* samples = core().FindRequest(seq->request_id)) {
    for (const auto& s : *samples) {
      if (s.get() != seq && (s->status != SeqStatus::kFinished || s->pending_forks > 0)) return;
    }
  }
  auto it = requests_.find(seq->request_id);
  if (it == requests_.end()) return;
  const LoraAdapter* a = it->second;
  requests_.erase(it);
  if (--active_[a] == 0) {
    active_.erase(a);
    if (!held_.empty()) core().wake().Notify();  // a slot is free: the next step releases
  }
}

void LoraFeature::AddStats(EngineStats* stats) const {
  stats->lora_adapters_loaded = registry_ != nullptr ? static_cast<int64_t>(registry_->size()) : -1;
  stats->lora_requests_held = static_cast<int64_t>(held_.size());
  stats->lora_active_adapters = static_cast<int64_t>(active_.size());
}

}  // namespace tandem
