#include "common/engine/step_sampling.h"

#include "common/engine/engine_core.h"

namespace tandem {

void StepSampling::Plan(EngineCore& core, const ForwardBatch& batch,
                        const std::vector<Sequence*>& sampled,
                        const std::vector<size_t>& first_row) {
  rows_.clear();
  results_.clear();
  device_index_.assign(sampled.size(), -1);
  host_row_.assign(sampled.size(), 0);
  const bool device = core.options().device_sampling && core.backend().SupportsDeviceSampling();
  size_t on_device = 0;  // rows before the current one that stay on the device
  for (size_t i = 0; i < sampled.size(); ++i) {
    Sequence* seq = sampled[i];
    host_row_[i] = first_row[i] - on_device;
    if (!device || !seq->spec.draft.empty() || seq->pending_forks > 0) continue;
    DeviceSampleRow row;
    bool agreed = true;
    for (const auto& f : core.features()) {
      if (!f->OnDeviceSample(seq, &row)) {
        agreed = false;
        break;
      }
    }
    if (!agreed) continue;
    const SamplingParams& p = seq->params;
    row.logit_row = static_cast<int32_t>(first_row[i]);
    row.temperature = p.temperature;
    row.top_k = p.top_k;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    row.logprobs = p.logprobs;
    if (!p.greedy()) row.uniform = seq->rng.Uniform();
    core.BuildEdits(*seq, &row.edits);
    device_index_[i] = static_cast<int32_t>(rows_.size());
    rows_.push_back(std::move(row));
    ++on_device;
  }
  host_rows_ = batch.logit_rows.size() - on_device;
}

absl::Status StepSampling::Forward(Backend& backend, const ForwardBatch& batch,
                                   std::vector<float>* logits) {
  logits->resize(host_rows_ * static_cast<size_t>(backend.vocab_size()));
  if (rows_.empty()) return backend.Forward(batch, logits->data());
  return backend.ForwardSampled(batch, rows_, logits->data(), &results_);
}

absl::Status StepSampling::Launch(Backend& backend, const ForwardBatch& batch,
                                  const std::vector<DeviceTokenInput>& device_tokens) {
  results_.clear();
  return backend.LaunchStep(batch, rows_, device_tokens);
}

absl::Status StepSampling::Collect(Backend& backend, std::vector<float>* logits) {
  logits->resize(host_rows_ * static_cast<size_t>(backend.vocab_size()));
  return backend.CollectStep(logits->data(), &results_);
}

const DeviceSample* StepSampling::DeviceSampleOf(size_t i) const {
  const int32_t d = device_index_[i];
  return d < 0 ? nullptr : &results_[d];
}

}  // namespace tandem
