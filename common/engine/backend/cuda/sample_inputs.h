#pragma once

// The inputs of the device sampler (SampleRows, kernels.h) for a list of DeviceSampleRow, packed
// into one buffer that is uploaded in one copy: the layout, the packing on the host, and the
// kernel's arguments over the uploaded copy. Used by the backend (cuda_sampling.cc) and tests.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/sampler/device_sample.h"

namespace tandem::cuda {

// Offsets (bytes, 256-aligned) of each array in the packed buffer; `end` is its size.
struct SampleLayout {
  size_t rows = 0, edits = 0, phases = 0, masks = 0, revive = 0, end = 0;
};

// INVALID_ARGUMENT naming what is wrong when a row does not fit a step of `num_rows` logit rows
// over `vocab` tokens (row out of range or named twice, parameters out of range, edits outside
// the vocabulary or their phases, a mask of the wrong size).
absl::Status CheckSampleRows(const std::vector<DeviceSampleRow>& samples, int64_t num_rows,
                             int64_t vocab);

SampleLayout LayoutSampleInputs(const std::vector<DeviceSampleRow>& samples, int64_t vocab);

// Writes the packed inputs at `base` (layout.end bytes).
void PackSampleInputs(const std::vector<DeviceSampleRow>& samples, int64_t vocab,
                      const SampleLayout& layout, uint8_t* base);

// SampleRows' arguments over the packed inputs at `device_base`; the caller sets logits, work
// and out.
SampleArgs SampleArgsAt(const SampleLayout& layout, const uint8_t* device_base, int64_t rows,
                        int64_t vocab);

// The answer of SampleRows for one row, as the backend returns it.
DeviceSample ToDeviceSample(const SampleOutput& out, const DeviceSampleRow& row, int64_t vocab);

}  // namespace tandem::cuda
