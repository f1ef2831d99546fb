// CUDA backend: sampling on the device (Backend::ForwardSampled, LaunchStep: cuda_step.cc). After
// the step's forward pass the sampled rows' inputs (parameters, logit edits, masks) are uploaded
// in one copy, one kernel samples every row (sampling_kernels.cu), and only the tokens, the
// requested logprobs and the rows left to the host sampler come back.

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/sample_inputs.h"

namespace tandem::cuda {
namespace {

static_assert(sizeof(SampleEdit) == sizeof(LogitEdit) && alignof(SampleEdit) == alignof(LogitEdit),
              "SampleEdit mirrors LogitEdit");
static_assert(kMaxSampleLogprobs == kMaxDeviceLogprobs);

absl::Status CheckRow(const DeviceSampleRow& r, int64_t num_rows, int64_t vocab) {
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("device sampling: ", why));
  };
  if (r.logit_row < 0 || r.logit_row >= num_rows) {
    return bad(absl::StrCat("logit row ", r.logit_row, " outside [0, ", num_rows, ")"));
  }
  if (!(r.temperature >= 0.0f) || r.logprobs > kMaxDeviceLogprobs || r.top_k < 0 ||
      !(r.top_p > 0.0f && r.top_p <= 1.0f) || !(r.min_p >= 0.0f && r.min_p <= 1.0f) ||
      !(r.uniform >= 0.0 && r.uniform < 1.0)) {
    return bad(absl::StrCat("parameters of row ", r.logit_row, " out of range"));
  }
  int32_t prev = 0;
  for (int32_t end : r.edits.phase_end) {
    if (end < prev || end > static_cast<int64_t>(r.edits.edits.size())) return bad("phase ends");
    prev = end;
  }
  if (prev != static_cast<int64_t>(r.edits.edits.size())) return bad("edits past the last phase");
  for (const LogitEdit& e : r.edits.edits) {
    if (e.id < 0 || e.id >= vocab || static_cast<int32_t>(e.op) < 0 ||
        static_cast<int32_t>(e.op) > 3) {
      return bad(absl::StrCat("edit of token ", e.id));
    }
  }
  if (!r.mask.allowed.empty() && static_cast<int64_t>(r.mask.allowed.size()) != (vocab + 63) / 64) {
    return bad("mask size");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaBackend::EnqueueSampling(const std::vector<DeviceSampleRow>& samples) {
  if (samples.empty()) return absl::OkStatus();
  const int64_t v = model_->config().vocab_size;
  const int64_t rows = static_cast<int64_t>(samples.size());
  const SampleLayout layout = LayoutSampleInputs(samples, v);
  StepSlot& slot = slots_[cur_];
  TANDEM_RETURN_IF_ERROR(slot.sample_staging.Reserve(layout.end, "sampling staging"));
  if (sample_inputs_.bytes() < layout.end) {
    TANDEM_RETURN_IF_ERROR(sample_inputs_.Allocate(layout.end, "sampling inputs"));
  }
  const size_t work = static_cast<size_t>(rows * v) * sizeof(float);
  if (sample_work_.bytes() < work) {
    TANDEM_RETURN_IF_ERROR(sample_work_.Allocate(work, "sampling rows"));
  }
  const size_t out = rows * sizeof(SampleOutput);
  if (slot.sample_out.bytes() < out) {
    TANDEM_RETURN_IF_ERROR(slot.sample_out.Allocate(out, "sampling answers"));
  }
  TANDEM_RETURN_IF_ERROR(slot.sample_out_host.Reserve(out, "sampling answers staging"));
  PackSampleInputs(samples, v, layout, slot.sample_staging.as<uint8_t>());
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_inputs_.get(), slot.sample_staging.get(),
                                              layout.end, cudaMemcpyHostToDevice, stream_),
                              "cudaMemcpyAsync (sampling inputs)");
  SampleArgs args = SampleArgsAt(layout, sample_inputs_.as<uint8_t>(), rows, v);
  args.logits = logits_;
  args.work = sample_work_.as<float>();
  args.out = slot.sample_out.as<SampleOutput>();
  TANDEM_CUDA_RETURN_IF_ERROR(SampleRows(args, stream_), "SampleRows kernel launch");
  return absl::OkStatus();
}

absl::Status CheckSampleRows(const std::vector<DeviceSampleRow>& samples, int64_t num_rows,
                             int64_t vocab) {
  std::vector<bool> seen(num_rows, false);
  for (const DeviceSampleRow& r : samples) {
    TANDEM_RETURN_IF_ERROR(CheckRow(r, num_rows, vocab));
    if (seen[r.logit_row]) {
      return absl::InvalidArgumentError(
          absl::StrCat("device sampling: logit row ", r.logit_row, " sampled twice"));
    }
    seen[r.logit_row] = true;
  }
  return absl::OkStatus();
}

SampleLayout LayoutSampleInputs(const std::vector<DeviceSampleRow>& samples, int64_t vocab) {
  const size_t words = static_cast<size_t>((vocab + 63) / 64);
  size_t edits = 0, phases = 0, masks = 0, revive = 0;
  for (const DeviceSampleRow& r : samples) {
    edits += r.edits.edits.size();
    phases += r.edits.phase_end.size();
    masks += r.mask.allowed.empty() ? 0 : words;
    revive += r.mask.revive.size();
  }
  SampleLayout L;
  L.edits = AlignUp256(samples.size() * sizeof(SampleRowArgs));
  L.phases = AlignUp256(L.edits + edits * sizeof(SampleEdit));
  L.masks = AlignUp256(L.phases + phases * sizeof(int32_t));
  L.revive = AlignUp256(L.masks + masks * sizeof(uint64_t));
  L.end = AlignUp256(L.revive + revive * sizeof(int32_t));
  return L;
}

void PackSampleInputs(const std::vector<DeviceSampleRow>& samples, int64_t vocab,
                      const SampleLayout& L, uint8_t* base) {
  const int32_t words = static_cast<int32_t>((vocab + 63) / 64);
  auto* row_args = reinterpret_cast<SampleRowArgs*>(base + L.rows);
  auto* edit_out = reinterpret_cast<SampleEdit*>(base + L.edits);
  auto* phase_out = reinterpret_cast<int32_t*>(base + L.phases);
  auto* mask_out = reinterpret_cast<uint64_t*>(base + L.masks);
  auto* revive_out = reinterpret_cast<int32_t*>(base + L.revive);
  int32_t e = 0, p = 0, m = 0, rv = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const DeviceSampleRow& r = samples[i];
    SampleRowArgs a;
    a.logit_row = r.logit_row;
    a.top_k = r.top_k;
    a.temperature = r.temperature;
    a.top_p = r.top_p;
    a.min_p = r.min_p;
    a.logprobs = r.logprobs;
    a.uniform = r.uniform;
    a.edits_begin = e;
    a.phases_begin = p;
    a.num_phases = static_cast<int32_t>(r.edits.phase_end.size());
    if (!r.edits.edits.empty()) {
      std::memcpy(edit_out + e, r.edits.edits.data(), r.edits.edits.size() * sizeof(SampleEdit));
    }
    std::copy(r.edits.phase_end.begin(), r.edits.phase_end.end(), phase_out + p);
    e += static_cast<int32_t>(r.edits.edits.size());
    p += a.num_phases;
    if (!r.mask.allowed.empty()) {
      a.mask_begin = m;
      std::copy(r.mask.allowed.begin(), r.mask.allowed.end(), mask_out + m);
      m += words;
    }
    a.revive_begin = rv;
    a.num_revive = static_cast<int32_t>(r.mask.revive.size());
    std::copy(r.mask.revive.begin(), r.mask.revive.end(), revive_out + rv);
    rv += a.num_revive;
    row_args[i] = a;
  }
}

SampleArgs SampleArgsAt(const SampleLayout& L, const uint8_t* dev, int64_t rows, int64_t vocab) {
  SampleArgs args;
  args.vocab = static_cast<int32_t>(vocab);
  args.rows = reinterpret_cast<const SampleRowArgs*>(dev + L.rows);
  args.num_rows = static_cast<int32_t>(rows);
  args.edits = reinterpret_cast<const SampleEdit*>(dev + L.edits);
  args.phase_ends = reinterpret_cast<const int32_t*>(dev + L.phases);
  args.masks = reinterpret_cast<const uint64_t*>(dev + L.masks);
  args.revive = reinterpret_cast<const int32_t*>(dev + L.revive);
  return args;
}

DeviceSample ToDeviceSample(const SampleOutput& out, const DeviceSampleRow& row, int64_t vocab) {
  DeviceSample d;
  d.token = out.token;
  if (row.logprobs < 0) return d;
  d.chosen = {out.token, out.logprob};
  const int64_t top = std::min<int64_t>(row.logprobs, vocab);
  for (int64_t j = 0; j < top; ++j) d.top.push_back({out.top_ids[j], out.top_logprobs[j]});
  return d;
}

}  // namespace tandem::cuda
