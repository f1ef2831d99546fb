#include "common/engine/backend/cpu/kernels/membw.h"

#include <sys/mman.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "common/base/cpu_features.h"
#include "common/base/log.h"

namespace tandem::cpu {
namespace {

constexpr size_t kAlign = 2u << 20;  // 2 MiB: lets transparent huge pages back the buffer

// Sums 64-bit words of [p, p + n) (n a multiple of 256 bytes) so the loads cannot be elided, as
// the decode kernels read their weights: kStreams quarters side by side, each prefetched
// kPrefetchBytes ahead. A single sequential stream per thread, left to the hardware
// prefetchers, reads slower than the MatMul kernels stream, and rooflines against it would
// come out above 100%.
constexpr int kStreams = 4;
constexpr size_t kPrefetchBytes = 1024;
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t ReadAvx2(const char* p, size_t n) {
  const size_t part = n / kStreams / 64 * 64;
  __m256i acc[kStreams];
  for (int s = 0; s < kStreams; ++s) acc[s] = _mm256_setzero_si256();
  for (size_t i = 0; i < part; i += 64) {
#pragma GCC unroll 4
    for (int s = 0; s < kStreams; ++s) {
      const char* q = p + s * part + i;
      _mm_prefetch(q + kPrefetchBytes, _MM_HINT_T0);
      const __m256i* v = reinterpret_cast<const __m256i*>(q);
      acc[s] = _mm256_add_epi64(acc[s],
                                _mm256_add_epi64(_mm256_load_si256(v), _mm256_load_si256(v + 1)));
    }
  }
  for (size_t i = kStreams * part; i < n; i += 32) {  // what the quarters left over
    acc[0] = _mm256_add_epi64(acc[0], _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
  }
  const __m256i s =
      _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

#endif

// The same streams in portable code (64-bit words; the compiler vectorizes the sums with the
// baseline's vectors: SSE2, NEON): the reader of CPUs without AVX2 and of aarch64.
uint64_t ReadPortable(const char* p, size_t n) {
  const size_t part = n / kStreams / 64 * 64;
  uint64_t acc[kStreams][8] = {};
  for (size_t i = 0; i < part; i += 64) {
    for (int s = 0; s < kStreams; ++s) {
      const char* q = p + s * part + i;
      __builtin_prefetch(q + kPrefetchBytes);
      uint64_t v[8];
      std::memcpy(v, q, sizeof v);
      for (int w = 0; w < 8; ++w) acc[s][w] += v[w];
    }
  }
  uint64_t total = 0;
  for (size_t i = kStreams * part; i + 8 <= n; i += 8) {  // what the quarters left over
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    total += v;
  }
  for (int s = 0; s < kStreams; ++s) {
    for (int w = 0; w < 8; ++w) total += acc[s][w];
  }
  return total;
}

void ForEachSlice(ThreadPool* pool, size_t bytes, const std::function<void(size_t, size_t)>& fn) {
  constexpr size_t kUnit = 4096;
  const int64_t units = static_cast<int64_t>(bytes / kUnit);
  auto range = [&](int64_t u0, int64_t u1) { fn(u0 * kUnit, u1 * kUnit); };
  if (pool == nullptr) {
    range(0, units);
  } else {  // one contiguous slice per thread
    pool->ParallelForGrain(units, (units + pool->size() - 1) / pool->size(), range);
  }
}

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(size_t bytes, ThreadPool* pool)
    : bytes_(std::max<size_t>(bytes / kAlign * kAlign, kAlign)), pool_(pool) {
  buf_ = static_cast<char*>(std::aligned_alloc(kAlign, bytes_));
  TANDEM_CHECK(buf_ != nullptr) << "cannot allocate " << bytes_ << " bytes";
  madvise(buf_, bytes_, MADV_HUGEPAGE);
  // First touch by the threads that will read (page placement), with a non-zero pattern.
  ForEachSlice(pool_, bytes_, [&](size_t b, size_t e) { std::memset(buf_ + b, 0x5a, e - b); });
  Pass();  // warm-up
}

ReadBandwidthProbe::~ReadBandwidthProbe() {
  if (sink_ == 1) {  // keeps the sums observable
    TLOG(DEBUG) << "membw sink";
  }
  std::free(buf_);
}

void ReadBandwidthProbe::Pass() {
  std::atomic<uint64_t> sink{0};
#if defined(__x86_64__)
  const bool avx2 = GetCpuFeatures().avx2;
#endif
  ForEachSlice(pool_, bytes_, [&](size_t b, size_t e) {
#if defined(__x86_64__)
    if (avx2) {
      sink.fetch_add(ReadAvx2(buf_ + b, e - b), std::memory_order_relaxed);
      return;
    }
#endif
    sink.fetch_add(ReadPortable(buf_ + b, e - b), std::memory_order_relaxed);
  });
  sink_ += sink.load();
}

double ReadBandwidthProbe::PassGBps() {
  const auto t0 = std::chrono::steady_clock::now();
  Pass();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(bytes_) / s / 1e9;
}

ReadBandwidth MeasureReadBandwidth(size_t bytes, int iterations, ThreadPool* pool) {
  ReadBandwidthProbe probe(bytes, pool);
  std::vector<double> gbps;
  for (int i = 0; i < std::max(iterations, 1); ++i) gbps.push_back(probe.PassGBps());
  std::sort(gbps.begin(), gbps.end());
  ReadBandwidth r;
  r.worst_gbps = gbps.front();
  r.best_gbps = gbps.back();
  r.median_gbps = gbps.size() % 2 ? gbps[gbps.size() / 2]
                                  : 0.5 * (gbps[gbps.size() / 2 - 1] + gbps[gbps.size() / 2]);
  return r;
}

double MeasureReadBandwidthGBps(size_t bytes, int iterations, ThreadPool* pool) {
  return MeasureReadBandwidth(bytes, iterations, pool).best_gbps;
}

}  // namespace tandem::cpu
