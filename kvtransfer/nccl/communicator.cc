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

absl::Status Communicator::WaitEvent(void* event) {
  cudaError_t e = cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0);
  if (e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaStreamWaitEvent (kv layer): ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
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

absl::Status Communicator::HeaderToDevice() {
  cudaError_t e =
      cudaMemcpyAsync(device_header_, host_header_, kHeaderBytes, cudaMemcpyHostToDevice, stream_);
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "cudaMemcpyAsync");
}

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
  if (broken_.exchange(true)) return;
  if (comm_ != nullptr) {
    DeviceGuard guard(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

}  // namespace tandem::kvtransfer::nccl
