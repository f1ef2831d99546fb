// Peak rate of the dot-product instructions the CPU MatMul kernels are built on, with nothing
// but register operands: vpdpbusd (int8 inputs: 64 multiply-adds per instruction) and vdpbf16ps
// (bf16 inputs: 32), 16 independent accumulators per thread, and on AVX2 the avx2 tier's integer
// step (vpmaddubsw + vpmaddwd + vpaddd: 32 multiply-adds, i8_tiles_256.h) and vfmadd231ps (8),
// on 1 .. N threads at once. The ceiling for compute-bound work (prefill, large decode
// batches): compare a MatMul's multiply-adds per second with it.
//   dot_peak [--threads 0] [--seconds 0.5]

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
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

// The avx2 tier's integer step in 6 independent chains (ymm4-15: 6 accumulators, 6 temporaries):
// vpmaddubsw, vpmaddwd with ones, vpaddd, as i8_tiles_256.h per 32 multiply-adds (its vpsignb,
// one more simple instruction, left out).
#define TANDEM_MADD_CHAIN(t, acc)                                        \
  "vpmaddubsw %2, %1, %%ymm" #t "\n\tvpmaddwd %3, %%ymm" #t ", %%ymm" #t \
  "\n\t"                                                                 \
  "vpaddd %%ymm" #t ", %%ymm" #acc ", %%ymm" #acc "\n\t"

__attribute__((target("avx2"))) double MaddRate(int64_t iters) {
  const __m256i a = _mm256_set1_epi32(0x01020304), b = _mm256_set1_epi32(0x05060708);
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t n = iters;
  const auto t0 = std::chrono::steady_clock::now();
  asm volatile(
      "vpxor %%ymm4, %%ymm4, %%ymm4\n\tvpxor %%ymm5, %%ymm5, %%ymm5\n\t"
      "vpxor %%ymm6, %%ymm6, %%ymm6\n\tvpxor %%ymm7, %%ymm7, %%ymm7\n\t"
      "vpxor %%ymm8, %%ymm8, %%ymm8\n\tvpxor %%ymm9, %%ymm9, %%ymm9\n\t"
      "1:\n\t" TANDEM_MADD_CHAIN(10, 4) TANDEM_MADD_CHAIN(11, 5) TANDEM_MADD_CHAIN(12, 6)
          TANDEM_MADD_CHAIN(13, 7) TANDEM_MADD_CHAIN(14, 8)
              TANDEM_MADD_CHAIN(15, 9) "dec %0\n\tjnz 1b"
      : "+r"(n)
      : "x"(a), "x"(b), "x"(ones)
      : "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14",
        "xmm15", "cc");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(iters) * 6 * 32 / s;
}

// vfmadd231ps in 10 independent chains (ymm6-15).
__attribute__((target("avx2,fma"))) double FmaRate(int64_t iters) {
  const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(0.0f);
  int64_t n = iters;
  const auto t0 = std::chrono::steady_clock::now();
  asm volatile(
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\tvxorps %%ymm7, %%ymm7, %%ymm7\n\t"
      "vxorps %%ymm8, %%ymm8, %%ymm8\n\tvxorps %%ymm9, %%ymm9, %%ymm9\n\t"
      "vxorps %%ymm10, %%ymm10, %%ymm10\n\tvxorps %%ymm11, %%ymm11, %%ymm11\n\t"
      "vxorps %%ymm12, %%ymm12, %%ymm12\n\tvxorps %%ymm13, %%ymm13, %%ymm13\n\t"
      "vxorps %%ymm14, %%ymm14, %%ymm14\n\tvxorps %%ymm15, %%ymm15, %%ymm15\n\t"
      "1:\n\t"
      "vfmadd231ps %1, %2, %%ymm6\n\tvfmadd231ps %1, %2, %%ymm7\n\t"
      "vfmadd231ps %1, %2, %%ymm8\n\tvfmadd231ps %1, %2, %%ymm9\n\t"
      "vfmadd231ps %1, %2, %%ymm10\n\tvfmadd231ps %1, %2, %%ymm11\n\t"
      "vfmadd231ps %1, %2, %%ymm12\n\tvfmadd231ps %1, %2, %%ymm13\n\t"
      "vfmadd231ps %1, %2, %%ymm14\n\tvfmadd231ps %1, %2, %%ymm15\n\t"
      "dec %0\n\tjnz 1b"
      : "+r"(n)
      : "x"(a), "x"(b)
      : "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(iters) * 10 * 8 / s;
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

// per_round: multiply-adds per round of fn's loop.
void Report(const char* name, double (*fn)(int64_t), int per_round, int threads, double seconds) {
  // Calibrate the rounds to about `seconds` on one thread.
  const double rate = fn(1 << 20) / static_cast<double>(per_round);
  const auto iters = static_cast<int64_t>(rate * seconds) + 1;
  for (int t = 1; t <= threads; ++t) {
    std::printf("%-19s threads %d: %.1f G multiply-adds/s\n", name, t,
                Together(t, fn, iters) / 1e9);
  }
}

#endif  // __x86_64__

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
#if defined(__x86_64__)
  const tandem::CpuFeatures& c = tandem::GetCpuFeatures();
  if (c.avx512f && c.avx512bw && c.avx512vnni) {
    tandem::Report("vpdpbusd", &tandem::VnniRate, tandem::kChains * 64, n, seconds);
  } else {
    std::printf("vpdpbusd: this CPU has no AVX512_VNNI\n");
  }
  if (c.avx512f && c.avx512bw && c.avx512bf16) {
    tandem::Report("vdpbf16ps", &tandem::Bf16Rate, tandem::kChains * 32, n, seconds);
  } else {
    std::printf("vdpbf16ps: this CPU has no AVX512_BF16\n");
  }
  if (c.avx2 && c.fma) {
    tandem::Report("vpmaddubsw+vpmaddwd", &tandem::MaddRate, 6 * 32, n, seconds);
    tandem::Report("vfmadd231ps", &tandem::FmaRate, 10 * 8, n, seconds);
  }
#else
  (void)n;
  (void)seconds;
  std::printf("dot_peak: x86-64 instructions only; nothing to measure on this architecture\n");
#endif
  return 0;
}
