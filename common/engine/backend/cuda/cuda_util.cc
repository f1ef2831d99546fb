#include "common/engine/backend/cuda/cuda_util.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::cuda {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusString(status)));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status DeviceBuffer::Allocate(size_t bytes, absl::string_view what) {
  Free();
  if (bytes == 0) return absl::OkStatus();
  void* p = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes),
                              absl::StrCat("cudaMalloc(", bytes, " bytes) for ", what));
  ptr_ = p;
  bytes_ = bytes;
  return absl::OkStatus();
}

void DeviceBuffer::Free() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::Status PinnedBuffer::Allocate(size_t bytes, absl::string_view what) {
  Free();
  if (bytes == 0) return absl::OkStatus();
  void* p = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes),
                              absl::StrCat("cudaMallocHost(", bytes, " bytes) for ", what));
  ptr_ = p;
  bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status PinnedBuffer::Reserve(size_t bytes, absl::string_view what) {
  if (bytes <= bytes_) return absl::OkStatus();
  return Allocate(bytes, what);
}

void PinnedBuffer::Free() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace tandem::cuda
