#pragma once

// CUDA helpers shared by the device transports (nccl/, cuda_ipc/): included only by their
// sources, which build against CUDA or its emulator.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/cuda/cuda_api.h"

namespace tandem::kvtransfer {

inline absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// Keeps the calling thread's current device (control calls arrive on the caller's threads).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// FAILED_PRECONDITION, in one line naming `transport`, unless CUDA device `device` is present.
inline absl::Status CheckCudaDevice(int device, absl::string_view transport) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat(transport, " kv transport needs a CUDA device: ", cudaGetErrorString(e)));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " not present (", count, " devices)"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
