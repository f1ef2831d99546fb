#include "kvtransfer/cuda_ipc/device.h"

#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kvtransfer/cuda_device.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"

namespace tandem::kvtransfer::cuda_ipc {

absl::Status CheckDevice(int device) { return CheckCudaDevice(device, "cuda-ipc"); }

absl::StatusOr<std::string> DeviceId(int device) {
  cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return CudaError(e, "cudaGetDeviceProperties");
  const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char out[64];
  std::snprintf(out, sizeof out,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  return std::string(out);
}

absl::StatusOr<std::string> ExportHandle(int device, void* base) {
  DeviceGuard guard(device);
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == kIpcHandleBytes);
  cudaError_t e = cudaIpcGetMemHandle(&handle, base);
  if (e != cudaSuccess) return CudaError(e, "cudaIpcGetMemHandle (the KV pool)");
  return std::string(reinterpret_cast<const char*>(&handle), sizeof handle);
}

absl::StatusOr<std::unique_ptr<MappedPool>> MappedPool::Open(int device, const std::string& handle,
                                                             uint64_t bytes) {
  if (handle.size() != kIpcHandleBytes) return absl::DataLossError("bad cuda ipc handle");
  DeviceGuard guard(device);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof h);
  void* p = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaIpcOpenMemHandle (the receiver's KV pool): ", cudaGetErrorString(e)));
  }
  return std::unique_ptr<MappedPool>(new MappedPool(device, static_cast<uint8_t*>(p), bytes));
}

MappedPool::~MappedPool() {
  DeviceGuard guard(device_);
  cudaIpcCloseMemHandle(base_);
}

absl::StatusOr<std::unique_ptr<CopyStream>> CopyStream::Create(int device) {
  DeviceGuard guard(device);
  std::unique_ptr<CopyStream> s(new CopyStream(device));
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return CudaError(e, "cudaStreamCreateWithFlags");
  s->stream_ = stream;
  return s;
}

CopyStream::~CopyStream() {
  if (stream_ == nullptr) return;
  DeviceGuard guard(device_);
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status CopyStream::Copy(void* dst, const void* src, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                  static_cast<cudaStream_t>(stream_));
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "cudaMemcpyAsync (kv region)");
}

absl::Status CopyStream::WaitEvent(void* event) {
  cudaError_t e =
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(event), 0);
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "cudaStreamWaitEvent (kv layer)");
}

absl::Status CopyStream::Record(void* event) {
  cudaError_t e =
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream_));
  return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "cudaEventRecord (kv copies)");
}

absl::StatusOr<void*> CreateEvent(int device) {
  DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e != cudaSuccess) return CudaError(e, "cudaEventCreateWithFlags");
  return static_cast<void*>(event);
}

void DestroyEvent(int device, void* event) {
  if (event == nullptr) return;
  DeviceGuard guard(device);
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

namespace {

// Polls `query` until it is no longer cudaErrorNotReady.
template <class Query>
absl::Status Poll(Query query, const char* what, absl::Time deadline,
                  const std::atomic<bool>* stop) {
  for (int spins = 0;; ++spins) {
    cudaError_t e = query();
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return CudaError(e, what);
    if (stop != nullptr && stop->load()) return absl::CancelledError("kv copy stopped");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("kv region copy did not complete in time");
    }
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace

absl::Status WaitEvent(void* event, absl::Time deadline, const std::atomic<bool>* stop) {
  return Poll([event] { return cudaEventQuery(static_cast<cudaEvent_t>(event)); },
              "cudaEventQuery (kv copies)", deadline, stop);
}

absl::Status CopyStream::Wait(absl::Time deadline, const std::atomic<bool>* stop) {
  auto stream = static_cast<cudaStream_t>(stream_);
  for (int spins = 0;; ++spins) {
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return CudaError(e, "cudaStreamQuery (kv copy)");
    if (stop != nullptr && stop->load()) return absl::CancelledError("kv copy stopped");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("kv region copy did not complete in time");
    }
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace tandem::kvtransfer::cuda_ipc
