// CUDA backend: launched steps (Backend::LaunchStep / CollectStep, common/engine/README.md
// "Overlapped steps"). A step stages into one of two slots, is enqueued (forward pass, device
// sampling, the copies back into the slot's pinned buffers) and an event is recorded behind it;
// collecting waits for that event only, so the next step may already be enqueued behind it.
// Forward and ForwardSampled are a launch followed by its collection.

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/sample_inputs.h"

namespace tandem::cuda {

absl::Status CudaBackend::ForwardSampled(const ForwardBatch& b,
                                         const std::vector<DeviceSampleRow>& samples, float* logits,
                                         std::vector<DeviceSample>* results) {
  if (!pending_.empty()) {
    return absl::FailedPreconditionError("ForwardSampled while a launched step is not collected");
  }
  TANDEM_RETURN_IF_ERROR(LaunchStep(b, samples, {}));
  return CollectStep(logits, results);
}

absl::Status CudaBackend::PrepareSlot() {
  StepSlot& slot = slots_[cur_];
  TANDEM_RETURN_IF_ERROR(slot.staging.Reserve(input_bytes_, "step input staging"));
  const size_t logits =
      static_cast<size_t>(cap_rows_ * model_->config().vocab_size) * sizeof(float);
  return slot.logits_host.Reserve(logits, "logits staging");
}

absl::Status CudaBackend::LaunchStep(const ForwardBatch& b,
                                     const std::vector<DeviceSampleRow>& samples,
                                     const std::vector<DeviceTokenInput>& device_tokens) {
  if (pending_.size() >= 2) {
    return absl::FailedPreconditionError("two launched steps are not collected yet");
  }
  const int64_t n = static_cast<int64_t>(b.logit_rows.size());
  const int64_t v = model_->config().vocab_size;
  TANDEM_RETURN_IF_ERROR(CheckSampleRows(samples, n, v));
  const SampleOutput* prev = nullptr;
  if (!device_tokens.empty()) {
    if (last_sampled_slot_ < 0) {
      return absl::FailedPreconditionError("device input tokens without a previous device sample");
    }
    for (const DeviceTokenInput& d : device_tokens) {
      if (d.token_index < 0 || d.token_index >= b.num_tokens() || d.sample_index < 0 ||
          d.sample_index >= last_samples_) {
        return absl::InvalidArgumentError(absl::StrCat("device input token ", d.token_index,
                                                       " from sample ", d.sample_index,
                                                       " out of range"));
      }
    }
    prev = slots_[last_sampled_slot_].sample_out.as<SampleOutput>();
  }
  StepSlot& slot = slots_[cur_];
  TANDEM_RETURN_IF_ERROR(EnqueueStep(b, device_tokens, prev));
  TANDEM_RETURN_IF_ERROR(EnqueueSampling(samples));
  // The rows left to the host, packed in logit_rows order, then the answers.
  std::vector<bool> sampled(n, false);
  for (const DeviceSampleRow& r : samples) sampled[r.logit_row] = true;
  cudaError_t err = cudaSuccess;
  const size_t row_bytes = static_cast<size_t>(v) * sizeof(float);
  int64_t packed = 0;
  for (int64_t i = 0; i < n && err == cudaSuccess; ++i) {
    if (sampled[i]) continue;
    // Consecutive host rows go in one copy.
    int64_t end = i + 1;
    while (end < n && !sampled[end]) ++end;
    err = cudaMemcpyAsync(slot.logits_host.as<uint8_t>() + packed * row_bytes,
                          reinterpret_cast<const uint8_t*>(logits_) + i * row_bytes,
                          (end - i) * row_bytes, cudaMemcpyDeviceToHost, stream_);
    packed += end - i;
    i = end - 1;
  }
  const size_t out_bytes = samples.size() * sizeof(SampleOutput);
  if (err == cudaSuccess && out_bytes > 0) {
    err = cudaMemcpyAsync(slot.sample_out_host.get(), slot.sample_out.get(), out_bytes,
                          cudaMemcpyDeviceToHost, stream_);
  }
  if (err == cudaSuccess) err = cudaEventRecord(slot.done, stream_);
  if (err != cudaSuccess) {
    sticky_ = CudaStatus(err, "CUDA step launch");
    return sticky_;
  }
  slot.host_rows = packed;
  slot.samples.clear();
  for (const DeviceSampleRow& r : samples) {
    DeviceSampleRow light;
    light.logit_row = r.logit_row;
    light.logprobs = r.logprobs;
    slot.samples.push_back(std::move(light));
  }
  if (!pending_.empty()) ++overlapped_launches_;
  pending_.push_back(cur_);
  last_sampled_slot_ = samples.empty() ? -1 : cur_;
  last_samples_ = static_cast<int64_t>(samples.size());
  cur_ ^= 1;
  return absl::OkStatus();
}

absl::Status CudaBackend::CollectStep(float* logits, std::vector<DeviceSample>* results) {
  if (pending_.empty()) return absl::FailedPreconditionError("no launched step to collect");
  StepSlot& slot = slots_[pending_.front()];
  pending_.pop_front();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  const cudaError_t err = cudaEventSynchronize(slot.done);
  if (err != cudaSuccess) {
    // Kernel faults surface here and leave the context unusable: fail every later step too.
    sticky_ = CudaStatus(err, "CUDA forward pass");
  }
  if (!sticky_.ok()) return sticky_;
  const size_t row_bytes = static_cast<size_t>(model_->config().vocab_size) * sizeof(float);
  if (slot.host_rows > 0) {
    std::memcpy(logits, slot.logits_host.get(), slot.host_rows * row_bytes);
  }
  results->assign(slot.samples.size(), DeviceSample{});
  const SampleOutput* out = slot.sample_out_host.as<SampleOutput>();
  const int64_t v = model_->config().vocab_size;
  for (size_t i = 0; i < slot.samples.size(); ++i) {
    if (out[i].token < 0 || out[i].token >= v) {  // never from a sampler that ran
      sticky_ = absl::InternalError(absl::StrCat("device sample ", i, " is token ", out[i].token,
                                                 ", outside the vocabulary"));
      return sticky_;
    }
    (*results)[i] = ToDeviceSample(out[i], slot.samples[i], v);
  }
  device_sampled_rows_ += static_cast<int64_t>(slot.samples.size());
  return absl::OkStatus();
}

}  // namespace tandem::cuda
