#include "kvtransfer/nccl/communicator.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "kvtransfer/cuda_device.h"
#include "kvtransfer/nccl/control.h"

namespace tandem::kvtransfer::nccl {

absl::Status CheckDevice(int device) { return CheckCudaDevice(device, "nccl"); }

absl::StatusOr<std::string> NewUniqueId() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
  }
  static_assert(sizeof(id.internal) == kUniqueIdBytes);
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Start(const std::string& unique_id,
                                                                  int rank, int device,
                                                                  size_t scratch_bytes) {
  if (unique_id.size() != kUniqueIdBytes) return absl::InvalidArgumentError("bad ncclUniqueId");
  std::unique_ptr<Communicator> c(new Communicator);
  c->rank_ = rank;
  c->device_ = device;
  DeviceGuard guard(device);
  cudaError_t e;
  if ((e = cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking)) != cudaSuccess) {
    return CudaError(e, "cudaStreamCreate");
  }
  void* host = nullptr;
  if ((e = cudaMallocHost(&host, kHeaderBytes)) != cudaSuccess)
    return CudaError(e, "cudaMallocHost");
  c->host_header_ = static_cast<MessageHeader*>(host);
  if ((e = cudaMalloc(&c->device_header_, kHeaderBytes)) != cudaSuccess) {
    return CudaError(e, "cudaMalloc");
  }
  c->scratch_bytes_ = scratch_bytes;
  if (scratch_bytes > 0 && (e = cudaMalloc(&c->device_scratch_, scratch_bytes)) != cudaSuccess) {
    return CudaError(e, "cudaMalloc");
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), kUniqueIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c->comm_, 2, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    c->comm_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ncclCommInitRank: ", ncclGetErrorString(r)));
  }
  return c;
}

Communicator::~Communicator() {
  DeviceGuard guard(device_);
  if (comm_ != nullptr) {
    bool clean = false;
    if (!broken_ && ncclCommFinalize(comm_) != ncclSystemError) {
      const absl::Time deadline = absl::Now() + absl::Seconds(2);
      ncclResult_t state = ncclInProgress;
      while (absl::Now() < deadline) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      clean = state == ncclSuccess;
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  for (HeaderSlot& slot : free_slots_) {
    cudaFreeHost(slot.host);
    cudaFree(slot.device);
  }
  if (host_header_ != nullptr) cudaFreeHost(host_header_);
  if (device_header_ != nullptr) cudaFree(device_header_);
  if (device_scratch_ != nullptr) cudaFree(device_scratch_);
}

absl::Status Communicator::Check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  Abort();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

absl::Status Communicator::WaitReady(absl::Time deadline, const std::atomic<bool>* stop) {
  while (true) {
    ncclResult_t state;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return Check(r, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return Check(state, "nccl communicator setup");
    if (absl::Now() >= deadline || (stop != nullptr && *stop)) {
      Abort();
      return absl::DeadlineExceededError("nccl communicator setup timed out (peer never joined)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

absl::Status Communicator::Send(const void* buf, size_t bytes) {
  if (broken_) return absl::UnavailableError("nccl communicator aborted");
  return Check(ncclSend(buf, bytes, ncclUint8, 1 - rank_, comm_, stream_), "ncclSend");
}

absl::Status Communicator::Recv(void* buf, size_t bytes) {
  if (broken_) return absl::UnavailableError("nccl communicator aborted");
  return Check(ncclRecv(buf, bytes, ncclUint8, 1 - rank_, comm_, stream_), "ncclRecv");
}

absl::Status Communicator::GroupStart() { return Check(ncclGroupStart(), "ncclGroupStart"); }
absl::Status Communicator::GroupEnd() { return Check(ncclGroupEnd(), "ncclGroupEnd"); }

absl::Status Communicator::HeaderToHost() {
  cudaError_t e =
      cudaMemcpyAsync(host_header_, device_header_, kHeaderBytes, cudaMemcpyDeviceToHost, stream_);
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "cudaMemcpyAsync");
}

absl::Status Communicator::Wait(absl::Time deadline, const std::atomic<bool>* stop) {
  int spins = 0;
  while (true) {
    if (broken_) return absl::UnavailableError("nccl communicator aborted");
    ncclResult_t state;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return Check(r, "ncclCommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress) return Check(state, "nccl");
    if (state == ncclSuccess) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) {
        Abort();
        return CudaError(e, "cuda stream");
      }
    }
    if (stop != nullptr && *stop) {
      Abort();
      return absl::CancelledError("nccl transfer stopped");
    }
    if (absl::Now() >= deadline) {
      Abort();
      return absl::DeadlineExceededError("nccl transfer made no progress before its deadline");
    }
    // Spin briefly (messages complete in microseconds over NVLink), then back off to 1 ms
    // (an idle receiver waits here between messages).
    ++spins;
    if (spins > 200) {
      std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 ? 1000 : 50));
    }
  }
}

void Communicator::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  AbortLocked();
}

void Communicator::AbortLocked() {
  if (broken_.exchange(true)) return;
  if (comm_ != nullptr) {
    DeviceGuard guard(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

absl::Status Communicator::CheckLocked(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  AbortLocked();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

absl::StatusOr<HeaderSlot> Communicator::NewHeaderSlot() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_slots_.empty()) {
      HeaderSlot slot = free_slots_.back();
      free_slots_.pop_back();
      return slot;
    }
  }
  DeviceGuard guard(device_);
  HeaderSlot slot;
  void* host = nullptr;
  cudaError_t e = cudaMallocHost(&host, kHeaderBytes);
  if (e != cudaSuccess) return CudaError(e, "cudaMallocHost");
  slot.host = static_cast<MessageHeader*>(host);
  if ((e = cudaMalloc(&slot.device, kHeaderBytes)) != cudaSuccess) {
    cudaFreeHost(host);
    return CudaError(e, "cudaMalloc");
  }
  return slot;
}

void Communicator::FreeHeaderSlot(HeaderSlot slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_slots_.push_back(slot);
}

absl::StatusOr<void*> Communicator::NewEvent() {
  DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e != cudaSuccess) return CudaError(e, "cudaEventCreate");
  return static_cast<void*>(event);
}

void Communicator::FreeEvent(void* event) {
  DeviceGuard guard(device_);
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

absl::Status Communicator::SettleLocked(absl::Time deadline) {
  while (true) {
    ncclResult_t state;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return CheckLocked(r, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return CheckLocked(state, "nccl");
    if (absl::Now() >= deadline) {
      AbortLocked();
      return absl::DeadlineExceededError("nccl did not accept a message before its deadline");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

absl::Status Communicator::EnqueueMessage(void* ready, const HeaderSlot& slot,
                                          const std::vector<RegionRun>& runs, void* done,
                                          absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return absl::UnavailableError("nccl communicator aborted");
  cudaError_t e;
  if (ready != nullptr &&
      (e = cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(ready), 0)) != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaStreamWaitEvent (kv layer): ", cudaGetErrorString(e)));
  }
  e = cudaMemcpyAsync(slot.device, slot.host, kHeaderBytes, cudaMemcpyHostToDevice, stream_);
  if (e != cudaSuccess) return CudaError(e, "cudaMemcpyAsync");
  const int peer = 1 - rank_;
  absl::Status s =
      CheckLocked(ncclSend(slot.device, kHeaderBytes, ncclUint8, peer, comm_, stream_), "ncclSend");
  if (s.ok()) s = SettleLocked(deadline);
  if (s.ok()) s = CheckLocked(ncclGroupStart(), "ncclGroupStart");
  for (size_t i = 0; s.ok() && i < runs.size(); ++i) {
    s = CheckLocked(ncclSend(runs[i].data, runs[i].bytes, ncclUint8, peer, comm_, stream_),
                    "ncclSend");
  }
  if (s.ok()) s = CheckLocked(ncclGroupEnd(), "ncclGroupEnd");
  if (s.ok()) s = SettleLocked(deadline);
  if (!s.ok()) return s;
  e = cudaEventRecord(static_cast<cudaEvent_t>(done), stream_);
  if (e != cudaSuccess) {
    AbortLocked();
    return absl::InternalError(absl::StrCat("cudaEventRecord: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

absl::Status Communicator::WaitFor(void* event, absl::Time deadline,
                                   const std::atomic<bool>* stop) {
  int spins = 0;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) return absl::UnavailableError("nccl communicator aborted");
      ncclResult_t state;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return CheckLocked(r, "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) return CheckLocked(state, "nccl");
      cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) {
        AbortLocked();
        return CudaError(e, "cuda event");
      }
      if (stop != nullptr && *stop) {
        AbortLocked();
        return absl::CancelledError("nccl transfer stopped");
      }
      if (absl::Now() >= deadline) {
        AbortLocked();
        return absl::DeadlineExceededError("nccl transfer made no progress before its deadline");
      }
    }
    ++spins;
    if (spins > 200) {
      std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 ? 1000 : 50));
    }
  }
}

}  // namespace tandem::kvtransfer::nccl
