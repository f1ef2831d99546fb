// Whole-block copies: direct to and from page-locked memory, staged otherwise (block_staging.h).

#include "common/engine/backend/cuda/block_staging.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem::cuda {

void PinnedRanges::Add(const uint8_t* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_.emplace_back(base, bytes);
}

void PinnedRanges::Remove(const uint8_t* base) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(ranges_, [base](const auto& r) { return r.first == base; });
}

bool PinnedRanges::Contains(const uint8_t* p, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(ranges_.begin(), ranges_.end(), [&](const auto& r) {
    return p >= r.first && p + bytes <= r.first + r.second;
  });
}

BlockStaging::BlockStaging(cudaStream_t stream, int64_t num_layers, size_t layer_bytes,
                           size_t bytes, std::function<uint8_t*(int64_t, int32_t)> region)
    : stream_(stream),
      num_layers_(num_layers),
      layer_bytes_(layer_bytes),
      budget_(bytes),
      region_(std::move(region)) {}

BlockStaging::~BlockStaging() {
  for (auto& [ticket, c] : copies_) {
    cudaEventSynchronize(c.done);
    cudaEventDestroy(c.done);
  }
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
}

absl::StatusOr<HostMemory> BlockStaging::AllocatePinned(size_t bytes) {
  HostMemory m;
  if (bytes == 0) return m;
  void* p = nullptr;
  if (const cudaError_t err = cudaMallocHost(&p, bytes); err != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot pin ", bytes, " bytes of host memory (",
                     CudaStatus(err, "cudaMallocHost").message(), ")"));
  }
  auto* base = static_cast<uint8_t*>(p);
  pinned_->Add(base, bytes);
  m.data = std::shared_ptr<uint8_t>(base, [ranges = pinned_](uint8_t* q) {
    ranges->Remove(q);
    cudaFreeHost(q);
  });
  m.bytes = bytes;
  m.pinned = true;
  return m;
}

bool BlockStaging::EnsureSlots() {
  if (!slot_busy_.empty()) return true;
  if (slots_failed_) return false;
  const size_t n = std::max<size_t>(1, budget_ / std::max<size_t>(1, block_bytes()));
  if (absl::Status st = buffer_.Allocate(n * block_bytes(), "KV block staging"); !st.ok()) {
    TLOG(WARNING) << "KV tiers: no pinned staging for asynchronous block copies (" << st
                  << "); blocks outside the host tier's pinned memory are not copied";
    slots_failed_ = true;
    return false;
  }
  slot_busy_.assign(n, false);
  return true;
}

int BlockStaging::TakeSlot() {
  if (!EnsureSlots()) return -1;
  const auto it = std::find(slot_busy_.begin(), slot_busy_.end(), false);
  if (it == slot_busy_.end()) return -1;
  *it = true;
  return static_cast<int>(it - slot_busy_.begin());
}

cudaEvent_t BlockStaging::TakeEvent() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      err != cudaSuccess) {
    TLOG(WARNING) << CudaStatus(err, "cudaEventCreateWithFlags (KV block copy)");
    return nullptr;
  }
  return e;
}

cudaError_t BlockStaging::Enqueue(uint8_t* host, int32_t block, bool read, cudaEvent_t done) {
  for (int64_t l = 0; l < num_layers_; ++l) {
    uint8_t* h = host + l * layer_bytes_;
    uint8_t* device = region_(l, block);
    const cudaError_t err =
        read ? cudaMemcpyAsync(h, device, layer_bytes_, cudaMemcpyDeviceToHost, stream_)
             : cudaMemcpyAsync(device, h, layer_bytes_, cudaMemcpyHostToDevice, stream_);
    if (err != cudaSuccess) return err;
  }
  return cudaEventRecord(done, stream_);
}

std::optional<uint64_t> BlockStaging::Start(int32_t block, uint8_t* host, bool read, int slot,
                                            uint8_t* dst) {
  cudaEvent_t done = TakeEvent();
  cudaError_t err = done == nullptr ? cudaErrorMemoryAllocation : cudaSuccess;
  if (err == cudaSuccess) {
    if (slot >= 0 && !read) {
      std::memcpy(SlotData(slot), host, block_bytes());
      staged_host_bytes_ += static_cast<int64_t>(block_bytes());
    }
    err = Enqueue(slot >= 0 ? SlotData(slot) : host, block, read, done);
  }
  if (err != cudaSuccess) {
    if (done != nullptr) free_events_.push_back(done);
    if (slot >= 0) slot_busy_[slot] = false;
    if (done != nullptr) {
      TLOG(WARNING) << CudaStatus(err, read ? "KV block copy-out" : "KV block install");
    }
    return std::nullopt;
  }
  ++(slot >= 0 ? staged_copies_ : direct_copies_);
  const uint64_t ticket = next_ticket_++;
  copies_[ticket] = Copy{done, slot, dst};
  return ticket;
}

std::optional<uint64_t> BlockStaging::StartRead(int32_t block, uint8_t* dst) {
  if (pinned_->Contains(dst, block_bytes())) return Start(block, dst, /*read=*/true, -1, nullptr);
  const int slot = TakeSlot();
  if (slot < 0) return std::nullopt;
  return Start(block, nullptr, /*read=*/true, slot, dst);
}

std::optional<uint64_t> BlockStaging::StartWrite(int32_t block, const uint8_t* src) {
  // The copy only reads `host` (cudaMemcpyHostToDevice).
  auto* host = const_cast<uint8_t*>(src);
  if (pinned_->Contains(src, block_bytes())) return Start(block, host, /*read=*/false, -1, nullptr);
  const int slot = TakeSlot();
  if (slot < 0) return std::nullopt;
  return Start(block, host, /*read=*/false, slot, nullptr);
}

absl::StatusOr<bool> BlockStaging::Poll(uint64_t ticket, bool wait) {
  auto it = copies_.find(ticket);
  if (it == copies_.end()) {
    return absl::NotFoundError(absl::StrCat("no block copy with ticket ", ticket));
  }
  Copy& c = it->second;
  const cudaError_t err = wait ? cudaEventSynchronize(c.done) : cudaEventQuery(c.done);
  if (err == cudaErrorNotReady) return false;
  if (err == cudaSuccess && c.slot >= 0 && c.dst != nullptr) {
    std::memcpy(c.dst, SlotData(c.slot), block_bytes());
    staged_host_bytes_ += static_cast<int64_t>(block_bytes());
  }
  if (c.slot >= 0) slot_busy_[c.slot] = false;
  free_events_.push_back(c.done);
  copies_.erase(it);
  if (err != cudaSuccess) return CudaStatus(err, "KV block copy");
  return true;
}

int64_t BlockStaging::slots_in_use() const {
  return std::count(slot_busy_.begin(), slot_busy_.end(), true);
}

}  // namespace tandem::cuda
