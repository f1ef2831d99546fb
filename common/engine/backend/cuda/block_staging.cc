// Pinned block staging (block_staging.h).

#include "common/engine/backend/cuda/block_staging.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem::cuda {

BlockStaging::BlockStaging(cudaStream_t stream, int64_t num_layers, size_t layer_bytes,
                           size_t bytes, std::function<uint8_t*(int64_t, int32_t)> region)
    : stream_(stream),
      num_layers_(num_layers),
      layer_bytes_(layer_bytes),
      budget_(bytes),
      region_(std::move(region)) {}

BlockStaging::~BlockStaging() {
  for (Slot& s : slots_) {
    if (s.state != State::kFree) cudaEventSynchronize(s.done);
    cudaEventDestroy(s.done);
  }
}

bool BlockStaging::EnsureAllocated() {
  if (!slots_.empty()) return true;
  if (failed_) return false;
  const size_t n = std::max<size_t>(1, budget_ / std::max<size_t>(1, block_bytes()));
  absl::Status st = buffer_.Allocate(n * block_bytes(), "KV block staging");
  slots_.resize(n);
  for (Slot& s : slots_) {
    if (!st.ok()) break;
    const cudaError_t err = cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming);
    if (err != cudaSuccess) st = CudaStatus(err, "cudaEventCreateWithFlags (KV block staging)");
  }
  if (!st.ok()) {
    TLOG(WARNING) << "KV tiers: no pinned staging for asynchronous block copies (" << st
                  << "); blocks leaving the pool are not copied out";
    for (Slot& s : slots_) {
      if (s.done != nullptr) cudaEventDestroy(s.done);
    }
    slots_.clear();
    buffer_.Free();
    failed_ = true;
    return false;
  }
  return true;
}

int BlockStaging::TakeSlot() {
  if (!EnsureAllocated()) return -1;
  int found = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    Slot& s = slots_[i];
    if (s.state == State::kWrite && cudaEventQuery(s.done) != cudaErrorNotReady) {
      s.state = State::kFree;  // landed (or failed: the forward pass reports the stream's error)
    }
    if (s.state == State::kFree && found < 0) found = i;
  }
  return found;
}

cudaError_t BlockStaging::Enqueue(int slot, int32_t block, bool read) {
  for (int64_t l = 0; l < num_layers_; ++l) {
    uint8_t* host = SlotData(slot) + l * layer_bytes_;
    uint8_t* device = region_(l, block);
    const cudaError_t err =
        read ? cudaMemcpyAsync(host, device, layer_bytes_, cudaMemcpyDeviceToHost, stream_)
             : cudaMemcpyAsync(device, host, layer_bytes_, cudaMemcpyHostToDevice, stream_);
    if (err != cudaSuccess) return err;
  }
  return cudaEventRecord(slots_[slot].done, stream_);
}

std::optional<uint64_t> BlockStaging::StartRead(int32_t block) {
  const int slot = TakeSlot();
  if (slot < 0) return std::nullopt;
  if (const cudaError_t err = Enqueue(slot, block, /*read=*/true); err != cudaSuccess) {
    TLOG(WARNING) << CudaStatus(err, "KV block copy-out");
    return std::nullopt;
  }
  slots_[slot].state = State::kRead;
  slots_[slot].ticket = next_ticket_++;
  return slots_[slot].ticket;
}

absl::StatusOr<bool> BlockStaging::PollRead(uint64_t ticket, uint8_t* dst, bool wait) {
  auto it = std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) {
    return s.state == State::kRead && s.ticket == ticket;
  });
  if (it == slots_.end()) {
    return absl::NotFoundError(absl::StrCat("no block read with ticket ", ticket));
  }
  const cudaError_t err = wait ? cudaEventSynchronize(it->done) : cudaEventQuery(it->done);
  if (err == cudaErrorNotReady) return false;
  it->state = State::kFree;
  if (err != cudaSuccess) return CudaStatus(err, "KV block copy-out");
  std::memcpy(dst, SlotData(static_cast<int>(it - slots_.begin())), block_bytes());
  return true;
}

bool BlockStaging::StartWrite(int32_t block, const uint8_t* src) {
  const int slot = TakeSlot();
  if (slot < 0) return false;
  std::memcpy(SlotData(slot), src, block_bytes());
  if (const cudaError_t err = Enqueue(slot, block, /*read=*/false); err != cudaSuccess) {
    TLOG(WARNING) << CudaStatus(err, "KV block install");
    return false;
  }
  slots_[slot].state = State::kWrite;
  return true;
}

int64_t BlockStaging::slots_in_use() const {
  return std::count_if(slots_.begin(), slots_.end(),
                       [](const Slot& s) { return s.state != State::kFree; });
}

}  // namespace tandem::cuda
