// Peak rate of the dot-product instructions the CPU MatMul kernels are built on, with nothing
// but register operands: vpdpbusd (int8 inputs: 64 multiply-adds per instruction) and vdpbf16ps
// (bf16 inputs: 32), 16 independent accumulators per thread, on 1 .. N threads at once. The
// ceiling for compute-bound work (prefill, large decode batches): compare a MatMul's
// multiply-adds per second with it.
//   dot_peak [--threads 0] [--seconds 0.5]

#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/base/cpu_features.h"
#include "common/base/flags.h"
#include "common/base/thread_pool.h"

namespace tandem {
namespace {

constexpr int kChains = 16;

// kChains independent instructions per round into zmm16-31, written out in assembly: compiled
// from intrinsics, GCC shuffled the accumulators between registers and the stack every round,
// and measured its own moves.
#define TANDEM_DOT16(op)                                                           \
  op " %1, %2, %%zmm16\n\t" op " %1, %2, %%zmm17\n\t" op " %1, %2, %%zmm18\n\t" op \
     " %1, %2, %%zmm19\n\t" op " %1, %2, %%zmm20\n\t" op " %1, %2, %%zmm21\n\t" op \
     " %1, %2, %%zmm22\n\t" op " %1, %2, %%zmm23\n\t" op " %1, %2, %%zmm24\n\t" op \
     " %1, %2, %%zmm25\n\t" op " %1, %2, %%zmm26\n\t" op " %1, %2, %%zmm27\n\t" op \
     " %1, %2, %%zmm28\n\t" op " %1, %2, %%zmm29\n\t" op " %1, %2, %%zmm30\n\t" op \
     " %1, %2, %%zmm31\n\t"

// The accumulators start at +0 (no denormal or NaN operands).
#define TANDEM_ZERO16                                                        \
  "vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm17, %%zmm17, %%zmm17\n\t" \
  "vpxord %%zmm18, %%zmm18, %%zmm18\n\tvpxord %%zmm19, %%zmm19, %%zmm19\n\t" \
  "vpxord %%zmm20, %%zmm20, %%zmm20\n\tvpxord %%zmm21, %%zmm21, %%zmm21\n\t" \
  "vpxord %%zmm22, %%zmm22, %%zmm22\n\tvpxord %%zmm23, %%zmm23, %%zmm23\n\t" \
  "vpxord %%zmm24, %%zmm24, %%zmm24\n\tvpxord %%zmm25, %%zmm25, %%zmm25\n\t" \
  "vpxord %%zmm26, %%zmm26, %%zmm26\n\tvpxord %%zmm27, %%zmm27, %%zmm27\n\t" \
  "vpxord %%zmm28, %%zmm28, %%zmm28\n\tvpxord %%zmm29, %%zmm29, %%zmm29\n\t" \
  "vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"

#define TANDEM_DOT_LOOP(op, a, b, iters)                                                          \
  asm volatile(TANDEM_ZERO16 "1:\n\t" TANDEM_DOT16(op) "dec %0\n\tjnz 1b"                         \
               : "+r"(iters)                                                                      \
               : "v"(a), "v"(b)                                                                   \
               : "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", \
                 "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "cc")

// Multiply-adds per second of one thread over `iters` (> 0) rounds.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double VnniRate(int64_t iters) {
  const __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x05060708);
  int64_t n = iters;
  const auto t0 = std::chrono::steady_clock::now();
  TANDEM_DOT_LOOP("vpdpbusd", a, b, n);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(iters) * kChains * 64 / s;
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) double Bf16Rate(int64_t iters) {
  // Normal bf16 values (1.0 and 2^-7): no denormal operands.
  const __m512i a = _mm512_set1_epi32(0x3f803f80), b = _mm512_set1_epi32(0x3c003c00);
  int64_t n = iters;
  const auto t0 = std::chrono::steady_clock::now();
  TANDEM_DOT_LOOP("vdpbf16ps", a, b, n);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(iters) * kChains * 32 / s;
}

// Sum over `threads` threads running fn(iters) at once.
double Together(int threads, double (*fn)(int64_t), int64_t iters) {
  std::vector<double> rates(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { rates[t] = fn(iters); });
  for (auto& t : pool) t.join();
  double sum = 0;
  for (double r : rates) sum += r;
  return sum;
}

// products: multiply-adds per instruction.
void Report(const char* name, double (*fn)(int64_t), int products, int threads, double seconds) {
  // Calibrate the rounds to about `seconds` on one thread.
  const double rate = fn(1 << 20) / (kChains * static_cast<double>(products));
  const auto iters = static_cast<int64_t>(rate * seconds) + 1;
  for (int t = 1; t <= threads; ++t) {
    std::printf("%-9s threads %d: %.1f G multiply-adds/s\n", name, t, Together(t, fn, iters) / 1e9);
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  int64_t threads = 0;
  double seconds = 0.5;
  tandem::FlagSet f("dot_peak", "peak vpdpbusd / vdpbf16ps multiply-adds per second");
  f.Int("threads", &threads, "up to this many threads (0: one per core)");
  f.Double("seconds", &seconds, "seconds per measurement");
  if (absl::Status st = f.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (f.help_requested()) return 0;
  const int n = threads > 0 ? static_cast<int>(threads) : tandem::DefaultComputeThreads();
  const tandem::CpuFeatures& c = tandem::GetCpuFeatures();
  if (c.avx512f && c.avx512bw && c.avx512vnni) {
    tandem::Report("vpdpbusd", &tandem::VnniRate, 64, n, seconds);
  } else {
    std::printf("vpdpbusd: this CPU has no AVX512_VNNI\n");
  }
  if (c.avx512f && c.avx512bw && c.avx512bf16) {
    tandem::Report("vdpbf16ps", &tandem::Bf16Rate, 32, n, seconds);
  } else {
    std::printf("vdpbf16ps: this CPU has no AVX512_BF16\n");
  }
  return 0;
}
