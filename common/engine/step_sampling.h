#pragma once

// Where a step's sampled sequences are sampled (README "Sampling on the device"): on the device,
// by a backend that can (Backend::ForwardSampled), or on the host from the logits rows the
// forward pass returns. The engine's step plans it before the forward pass, runs the pass through
// it and then asks, per sampled sequence, for its device sample or its host rows.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/backend/backend.h"
#include "common/engine/sampler/device_sample.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

class EngineCore;

class StepSampling {
 public:
  // Decides for each of `sampled` (its logits rows from first_row[i]: 1 + its draft length):
  // the device when the engine allows it (EngineOptions::device_sampling), the backend can, the
  // sequence has one row and forks nothing now (n > 1 forks draw from the row on the host), and
  // every feature's OnDeviceSample agrees (it fills the mask); else the host. A sequence sent to
  // the device draws its uniform from its generator now (temperature > 0), the one draw the host
  // sampler would make for this token.
  void Plan(EngineCore& core, const ForwardBatch& batch, const std::vector<Sequence*>& sampled,
            const std::vector<size_t>& first_row);
  // Backend::Forward, or ForwardSampled when any row goes to the device; `logits` is resized to
  // the rows that come back.
  absl::Status Forward(Backend& backend, const ForwardBatch& batch, std::vector<float>* logits);
  // The same split over a launched step (Backend::LaunchStep, README "Overlapped steps"): Launch
  // enqueues it, Collect waits for it and fills `logits` with the host rows.
  absl::Status Launch(Backend& backend, const ForwardBatch& batch,
                      const std::vector<DeviceTokenInput>& device_tokens);
  absl::Status Collect(Backend& backend, std::vector<float>* logits);

  // After Forward: the device's sample for sampled sequence i, or null when it is sampled on the
  // host, from the returned rows starting at HostRow(i).
  const DeviceSample* DeviceSampleOf(size_t i) const;
  size_t HostRow(size_t i) const { return host_row_[i]; }
  size_t device_rows() const { return rows_.size(); }
  // Rows the forward pass returns to the host (0: every sampled sequence is on the device and no
  // other row is wanted).
  size_t host_rows() const { return host_rows_; }
  // The index of sampled sequence i among the device's samples (-1: on the host).
  int32_t DeviceIndex(size_t i) const { return device_index_[i]; }

 private:
  std::vector<DeviceSampleRow> rows_;  // for the backend
  std::vector<int32_t> device_index_;  // per sampled sequence: index into rows_, or -1
  std::vector<size_t> host_row_;       // per sampled sequence on the host: its first row
  size_t host_rows_ = 0;               // rows the forward pass returns
  std::vector<DeviceSample> results_;
};

}  // namespace tandem
