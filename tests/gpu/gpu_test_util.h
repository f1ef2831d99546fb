#pragma once

// Helpers of the CUDA tests. Each test file is built twice: against the real CUDA backend
// (label gpu; skipped when no GPU is visible) and, through a *_emulated_test.cc wrapper, against
// the CPU emulator (label unit; TANDEM_CUDA_EMULATION), where "device" memory is host memory.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/base/half.h"
#include "common/cuda/cuda_api.h"
#include "common/engine/backend/cuda/cuda_backend.h"
#include "gtest/gtest.h"

namespace tandem::gpu_testing {

#if defined(TANDEM_CUDA_EMULATION)
inline constexpr bool kEmulated = true;
#else
inline constexpr bool kEmulated = false;
#endif

// Skips the test when no GPU is usable (never in the emulator).
#define TANDEM_REQUIRE_GPU()                                                               \
  do {                                                                                     \
    std::string tandem_gpu_why_;                                                           \
    if (!::tandem::CudaDeviceAvailable(&tandem_gpu_why_)) GTEST_SKIP() << tandem_gpu_why_; \
  } while (0)

#define TANDEM_CUDA_CHECK(expr)                                      \
  do {                                                               \
    const cudaError_t tandem_check_error_ = (expr);                  \
    ASSERT_EQ(tandem_check_error_, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(tandem_check_error_); \
  } while (0)

// A device array of T mirrored from/to host vectors. Poison() fills it with 0xff bytes (NaN for
// floats) so that an element a kernel fails to write shows up in the comparison.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n, 1) * sizeof(T)) !=
        cudaSuccess) {
      ptr_ = nullptr;
    }
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  void Poison() { cudaMemset(ptr_, 0xff, n_ * sizeof(T)); }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

// Fails (once, with the first bad index) unless every got[i] is finite and within
// tol * max(1, max |want|) of want[i].
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!std::isfinite(got[i]) || diff > tol * scale) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i]
                    << " (tolerance " << tol * scale << ")";
      return;
    }
  }
}

// max |got - want| / max |want|, NaN-propagating (NaN when any element is not finite).
inline double RelativeError(const float* got, const float* want, size_t n) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return NAN;
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

}  // namespace tandem::gpu_testing
