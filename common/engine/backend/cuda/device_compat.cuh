#pragma once

// What kernel sources (*.cu) use instead of CUDA keywords and intrinsics, so that the same source
// compiles with nvcc for the GPU and with the host compiler against the CPU emulator
// (emulation/emulator.h, TANDEM_CUDA_EMULATION) for tests on machines without a GPU:
//   TANDEM_GLOBAL / TANDEM_DEVICE / TANDEM_HOST_DEVICE   function qualifiers
//   TANDEM_SHARED                                         static shared arrays
//   TANDEM_DYNAMIC_SHARED(T, name)                        `T* name` = dynamic shared memory
//   TANDEM_LAUNCH(kernel, grid, block, smem, stream, args...)
//   dev::SyncThreads(), dev::ShflXor(v, m), dev::ShflXorAny(v, m), dev::Exp(x), dev::ExpD(x),
//   dev::LogD(x), dev::BitsToFloat(u), dev::FloatToBits(f)
//   dev::U32x4, dev::Load16(p) / dev::Load16Stream(p)     128-bit loads (16-byte aligned)
//   dev::U32x2, dev::Load8(p)                             64-bit loads (8-byte aligned)
//   dev::WarpSumGroups(v, width)                          sums over aligned groups of lanes
//   dev::ShflXorN(in, out, m)                             ShflXor of an array, one exchange
//   dev::MmaBf16_16816(d, a, b)                           warp-level tensor-core d += a b
//   TANDEM_UNROLL                                         `#pragma unroll` (nvcc only)
// threadIdx, blockIdx, blockDim and gridDim keep their CUDA names. Kernels must keep every lane of
// a warp converged at shuffles and every thread of a block at SyncThreads (the emulator checks).

#include <cstdint>

#include "common/cuda/cuda_api.h"

#if defined(TANDEM_CUDA_EMULATION)

#include <cmath>
#include <cstring>

#define TANDEM_GLOBAL
#define TANDEM_DEVICE inline
#define TANDEM_HOST_DEVICE inline
#define TANDEM_SHARED static
#define TANDEM_UNROLL
#define TANDEM_DYNAMIC_SHARED(T, name) \
  T* name = static_cast<T*>(::tandem::cuda_emu::DynamicShared())
#define TANDEM_LAUNCH(kernel, grid, block, smem, stream, ...)        \
  ::tandem::cuda_emu::Launch(kernel, ::tandem::cuda_emu::Dim3(grid), \
                             ::tandem::cuda_emu::Dim3(block), smem, stream, __VA_ARGS__)
#define threadIdx (::tandem::cuda_emu::ThreadIdx())
#define blockIdx (::tandem::cuda_emu::BlockIdx())
#define blockDim (::tandem::cuda_emu::BlockDim())
#define gridDim (::tandem::cuda_emu::GridDim())

namespace tandem::cuda::dev {
inline void SyncThreads() { ::tandem::cuda_emu::SyncThreads(); }
inline float ShflXor(float v, int lane_mask) {
  return ::tandem::cuda_emu::ShuffleXor(v, lane_mask);
}
// The xor-shuffle butterfly, evaluated by the emulator in one exchange (same bits).
inline float WarpSum(float v) { return ::tandem::cuda_emu::WarpSum(v); }
// Each v[i] summed over the aligned groups of `width` lanes (a power of two, at most 32): the
// xor-shuffle butterfly with lane masks width/2, ..., 1, evaluated by the emulator in one
// exchange for all N values (same bits).
template <int N>
inline void WarpSumGroups(float (&v)[N], int width) {
  static_assert(N <= ::tandem::cuda_emu::kMaxGroupSumValues);
  ::tandem::cuda_emu::WarpSumGroups(v, N, width);
}
// out[i] = ShflXor(in[i], lane_mask) for every i, in one exchange.
template <int N>
inline void ShflXorN(const float (&in)[N], float (&out)[N], int lane_mask) {
  static_assert(N <= ::tandem::cuda_emu::kMaxGroupSumValues);
  ::tandem::cuda_emu::ShuffleXorN(in, out, N, lane_mask);
}
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d += a b, fragments as PTX lays them out
// (g = lane / 4, t = lane % 4, two bf16 per register, the lower column / k in the low half):
//   a[0]: A[g][2t, 2t+1]  a[1]: A[g+8][2t, 2t+1]  a[2]: A[g][2t+8, 2t+9]  a[3]: A[g+8][2t+8, 2t+9]
//   b[0]: B[2t, 2t+1][g]  b[1]: B[2t+8, 2t+9][g]
//   d[0]: D[g][2t]  d[1]: D[g][2t+1]  d[2]: D[g+8][2t]  d[3]: D[g+8][2t+1]
// Every lane of the warp must call. The emulator computes the same exact products (its sums'
// rounding may differ from the hardware's in the last bits).
inline void MmaBf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  ::tandem::cuda_emu::MmaBf16_16816(d, a, b);
}
inline float Exp(float x) { return std::exp(x); }
inline double ExpD(double x) { return std::exp(x); }
inline double LogD(double x) { return std::log(x); }
// Xor-shuffle of any 4- or 8-byte value (double, uint64_t, int32_t).
template <class T>
inline T ShflXorAny(T v, int lane_mask) {
  return ::tandem::cuda_emu::ShuffleXor(v, lane_mask);
}
// 16 bytes as four 32-bit words (CUDA's uint4).
struct U32x4 {
  uint32_t x, y, z, w;
};
// 128-bit loads: through the read-only cache, or streaming (evict first) for data read once. A
// misaligned address faults on a GPU; the emulator aborts.
inline U32x4 Load16(const void* p) {
  ::tandem::cuda_emu::CheckAligned(p, 16, "128-bit load");
  U32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline U32x4 Load16Stream(const void* p) { return Load16(p); }
struct U32x2 {
  uint32_t x, y;
};
inline U32x2 Load8(const void* p) {
  ::tandem::cuda_emu::CheckAligned(p, 8, "64-bit load");
  U32x2 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float Sqrt(float x) { return std::sqrt(x); }
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
}  // namespace tandem::cuda::dev

#else  // nvcc

#define TANDEM_GLOBAL __global__
#define TANDEM_DEVICE __device__ __forceinline__
#define TANDEM_HOST_DEVICE __host__ __device__ __forceinline__
#define TANDEM_SHARED __shared__
#define TANDEM_UNROLL _Pragma("unroll")
#define TANDEM_DYNAMIC_SHARED(T, name)                                  \
  extern __shared__ __align__(16) unsigned char tandem_dynamic_smem_[]; \
  T* name = reinterpret_cast<T*>(tandem_dynamic_smem_)
#define TANDEM_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)

namespace tandem::cuda::dev {
__device__ __forceinline__ void SyncThreads() { __syncthreads(); }
__device__ __forceinline__ float ShflXor(float v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
__device__ __forceinline__ float WarpSum(float v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
template <int N>
__device__ __forceinline__ void ShflXorN(const float (&in)[N], float (&out)[N], int lane_mask) {
  TANDEM_UNROLL
  for (int i = 0; i < N; ++i) out[i] = __shfl_xor_sync(0xffffffffu, in[i], lane_mask);
}
__device__ __forceinline__ void MmaBf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                              const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ float Exp(float x) { return expf(x); }
__device__ __forceinline__ double ExpD(double x) { return exp(x); }
__device__ __forceinline__ double LogD(double x) { return log(x); }
template <int N>
__device__ __forceinline__ void WarpSumGroups(float (&v)[N], int width) {
  for (int m = width >> 1; m > 0; m >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], m);
  }
}
template <class T>
__device__ __forceinline__ T ShflXorAny(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
using U32x4 = uint4;
__device__ __forceinline__ U32x4 Load16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ U32x4 Load16Stream(const void* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}
using U32x2 = uint2;
__device__ __forceinline__ U32x2 Load8(const void* p) {
  return __ldg(reinterpret_cast<const uint2*>(p));
}
__device__ __forceinline__ float Sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float BitsToFloat(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t FloatToBits(float f) { return __float_as_uint(f); }
}  // namespace tandem::cuda::dev

#endif

namespace tandem::cuda::dev {

TANDEM_DEVICE float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN (the CPU kernels' conversion, bit for bit).
TANDEM_DEVICE uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

TANDEM_DEVICE float Load(const float* p) { return *p; }
TANDEM_DEVICE float Load(const uint16_t* p) { return Bf16ToFloat(*p); }
TANDEM_DEVICE void Store(float* p, float v) { *p = v; }
TANDEM_DEVICE void Store(uint16_t* p, float v) { *p = FloatToBf16(v); }

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// `scratch` holds 32 floats of shared memory; it may be reused after the call.
TANDEM_DEVICE float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  SyncThreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  t = WarpSum(t);
  SyncThreads();
  return t;
}

}  // namespace tandem::cuda::dev
