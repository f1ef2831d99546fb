#pragma once

// A CPU emulator for the small subset of CUDA C++ that the Tandem kernels use, so that the
// kernels and the backend around them run (slowly, exactly) on machines without a GPU.
//
// Each thread block runs as one fiber per CUDA thread on the calling OS thread; the fibers switch
// only at barriers (SyncThreads, warp barriers inside the shuffles), so shared memory behaves as
// on a GPU whose threads race only where a real kernel would race. A barrier that cannot complete
// (a __syncthreads skipped by some threads, a shuffle with exited lanes) aborts with a message:
// the emulator is stricter than the hardware. Blocks of a grid run one after another.
//
// Kernel sources reach this through device_compat.cuh; nothing else should include it.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem::cuda_emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// Coordinates of the running fiber's thread and block.
const Dim3& ThreadIdx();
const Dim3& BlockIdx();
const Dim3& BlockDim();
const Dim3& GridDim();

void SyncThreads();
void SyncWarp();
// Publishes `value` as this lane's, waits for the warp, returns lane `src_lane`'s value.
uint64_t WarpExchange(uint64_t value, int src_lane);
// Sum over the warp by the xor-shuffle butterfly (lane masks 16, 8, 4, 2, 1), in two barriers.
float WarpSum(float value);
// values[0..n) each summed over the aligned groups of `width` lanes (a power of two up to 32) by
// the xor-shuffle butterfly (lane masks width/2, ..., 1), every value of every lane in one
// exchange; n at most kMaxGroupSumValues, the same n and width on every lane of the warp.
inline constexpr int kMaxGroupSumValues = 64;
void WarpSumGroups(float* values, int n, int width);
// out[i] = the in[i] of lane (this lane ^ lane_mask) for i < n: n xor-shuffles in one exchange
// (n at most kMaxGroupSumValues, the same on every lane of the warp).
void ShuffleXorN(const float* in, float* out, int n, int lane_mask);
// mma.sync.m16n8k16 with bf16 A (row-major 16x16) and B (16x8, "col"), f32 accumulators d
// (16x8) += A B, every lane passing its fragments as PTX lays them out (a: 4 registers of two
// bf16, b: 2, d: 4 floats; see device_compat.cuh). Each d element is d + the sum of its 16
// products (exact in f32) added in double and rounded once: the hardware's order of the f32
// additions is not specified, so the emulator's result may differ from a GPU's in the last bits.
void MmaBf16_16816(float* d, const uint32_t* a, const uint32_t* b);
// Aborts (a GPU faults) when `p` is not a multiple of `alignment` bytes.
void CheckAligned(const void* p, size_t alignment, const char* what);
// The block's dynamic shared memory (poisoned with 0xff bytes when each block starts).
void* DynamicShared();

// Runs `body` once per thread of every block of the grid, or, while `stream` is being captured
// into a graph (see fake_cuda.h), records the whole grid for replay.
void RunGrid(Dim3 grid, Dim3 block, size_t dynamic_smem, const void* stream,
             std::function<void()> body);

// The capture list of `stream` when it is capturing, else nullptr (implemented by fake_cuda.cc).
std::vector<std::function<void()>>* CaptureList(const void* stream);
// Runs `op` in `stream`'s order: now, recorded when capturing, deferred on a deferred stream, or
// queued behind asynchronous work (implemented by fake_cuda.cc).
void EnqueueOnStream(const void* stream, std::function<void()> op);

template <class... P, class... A>
void Launch(void (*kernel)(P...), Dim3 grid, Dim3 block, size_t smem, const void* stream,
            A&&... args) {
  // Arguments are copied at launch, as a real launch does.
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  RunGrid(grid, block, smem, stream, [kernel, params] { std::apply(kernel, params); });
}

template <class T>
T ShuffleXor(T value, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const int lane = static_cast<int>(ThreadIdx().x +
                                    BlockDim().x * (ThreadIdx().y + BlockDim().y * ThreadIdx().z)) &
                   31;
  bits = WarpExchange(bits, lane ^ lane_mask);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace tandem::cuda_emu
