#pragma once

// Status conversion for CUDA runtime and cuBLAS errors, and owning device / pinned host buffers.

#include <cstddef>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "common/cuda/cuda_api.h"

namespace tandem::cuda {

// "<what>: <cudaErrorName>: <description>" as INTERNAL (RESOURCE_EXHAUSTED for out-of-memory).
absl::Status CudaStatus(cudaError_t error, absl::string_view what);
absl::Status CublasStatus(cublasStatus_t status, absl::string_view what);

#define TANDEM_CUDA_RETURN_IF_ERROR(expr, what)                    \
  do {                                                             \
    const cudaError_t tandem_cuda_error_ = (expr);                 \
    if (tandem_cuda_error_ != cudaSuccess) {                       \
      return ::tandem::cuda::CudaStatus(tandem_cuda_error_, what); \
    }                                                              \
  } while (0)

#define TANDEM_CUBLAS_RETURN_IF_ERROR(expr, what)                       \
  do {                                                                  \
    const cublasStatus_t tandem_cublas_status_ = (expr);                \
    if (tandem_cublas_status_ != CUBLAS_STATUS_SUCCESS) {               \
      return ::tandem::cuda::CublasStatus(tandem_cublas_status_, what); \
    }                                                                   \
  } while (0)

// Device memory from cudaMalloc, freed on destruction or reallocation. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Free(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Frees the current allocation, then allocates `bytes` (contents undefined). `what` names the
  // buffer in the error.
  absl::Status Allocate(size_t bytes, absl::string_view what);
  void Free();

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory from cudaMallocHost (staging for asynchronous copies). Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Free(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  absl::Status Allocate(size_t bytes, absl::string_view what);
  // Grows (never shrinks) to at least `bytes`, dropping the contents.
  absl::Status Reserve(size_t bytes, absl::string_view what);
  void Free();

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Bytes rounded up to a multiple of 256 (the alignment every sub-buffer keeps).
inline size_t AlignUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace tandem::cuda
