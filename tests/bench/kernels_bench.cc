// CPU kernel benchmarks (Google Benchmark). Decode MatMul reports weight bytes streamed per
// second (W_GBps) to compare with `membw`; prefill MatMul reports GFLOPs; attention reports KV
// bytes read per second. Weights are cycled through copies totalling more than the last-level
// cache, so decode numbers are DRAM numbers (as when a model's layers follow one another).
//
//   kernels_bench --benchmark_min_time=0.3 --benchmark_filter=Decode
//   TANDEM_SIMD=avx2 kernels_bench ...   (forces the AVX2 kernels)

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "common/base/cpu_features.h"
#include "common/base/half.h"
#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"

namespace tandem::cpu {
namespace {

constexpr int64_t kColdBytes = 512ll << 20;  // weight copies cycled per benchmark

// The fastest single iteration: on a shared machine, the iteration least disturbed by other
// processes (the means are reported too).
struct BestTime {
  std::chrono::steady_clock::time_point t0;
  double seconds = 1e30;
  void Start() { t0 = std::chrono::steady_clock::now(); }
  void Stop() {
    seconds = std::min(
        seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
};

ThreadPool* Pool(int threads) {
  static std::vector<std::unique_ptr<ThreadPool>> pools(64);
  if (!pools[threads]) pools[threads] = std::make_unique<ThreadPool>(threads);
  return pools[threads].get();
}

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

// `copies` weight matrices [N, K] of dtype, stored back to back.
std::vector<uint8_t> MakeWeights(DType dtype, int64_t N, int64_t K, int copies) {
  const auto src = Random(N * K, 7);
  const size_t bytes = N * K * DTypeSize(dtype);
  std::vector<uint8_t> buf(bytes * copies);
  for (int c = 0; c < copies; ++c) {
    uint8_t* dst = buf.data() + c * bytes;
    for (int64_t i = 0; i < N * K; ++i) {
      if (dtype == DType::kBF16) {
        reinterpret_cast<uint16_t*>(dst)[i] = FloatToBf16(src[i]);
      } else {
        reinterpret_cast<float*>(dst)[i] = src[i];
      }
    }
  }
  return buf;
}

// Args: dtype (0 f32, 1 bf16, 2 bf16 with bf16 inputs), M, K, N, threads.
void BM_MatMul(benchmark::State& state) {
  const DType dtype = state.range(0) >= 1 ? DType::kBF16 : DType::kF32;
  const int64_t M = state.range(1), K = state.range(2), N = state.range(3);
  ThreadPool* pool = Pool(static_cast<int>(state.range(4)));
  const size_t wbytes = N * K * DTypeSize(dtype);
  const int copies = static_cast<int>(std::max<int64_t>(1, kColdBytes / wbytes));
  const auto w = MakeWeights(dtype, N, K, copies);
  const auto x = Random(M * K, 8);
  std::vector<float> y(M * N);
  int c = 0;
  BestTime best;
  for (auto _ : state) {
    best.Start();
    MatMulWeight mw;
    mw.data = w.data() + c * wbytes;
    mw.dtype = dtype;
    mw.input_dtype = state.range(0) == 2 ? DType::kBF16 : DType::kF32;
    MatMul(x.data(), M, K, K, mw, N, nullptr, y.data(), N, pool);
    best.Stop();
    benchmark::DoNotOptimize(y.data());
    c = c + 1 == copies ? 0 : c + 1;
  }
  const double flops = 2.0 * M * N * K;
  state.counters["W_GBps"] = benchmark::Counter(static_cast<double>(wbytes) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["best_W_GBps"] = static_cast<double>(wbytes) * 1e-9 / best.seconds;
  state.counters["best_GFLOPs"] = flops * 1e-9 / best.seconds;
  state.SetLabel(SimdLevelName(ActiveSimdLevel()));
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bf16", "M", "K", "N", "thr"});
  const int t = DefaultComputeThreads();
  for (int bf16 : {2, 1, 0}) {
    for (int M : {1, 4, 8, 16, 32}) {
      b->Args({bf16, M, 2048, 2048, t});
      b->Args({bf16, M, 2048, 8192, t});
      b->Args({bf16, M, 8192, 2048, t});
    }
  }
  b->Args({1, 1, 2048, 8192, 1});  // single thread
}

void PrefillArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bf16", "M", "K", "N", "thr"});
  const int t = DefaultComputeThreads();
  for (int bf16 : {2, 1, 0}) b->Args({bf16, 512, 2048, 2048, t});
  b->Args({2, 512, 2048, 2048, 1});
  b->Args({1, 512, 2048, 2048, 1});
}

BENCHMARK(BM_MatMul)->Name("MatMulDecode")->Apply(DecodeArgs)->UseRealTime();
BENCHMARK(BM_MatMul)->Name("MatMulPrefill")->Apply(PrefillArgs)->UseRealTime();

// Attention over `seqs` sequences of `ctx` tokens.
// Args: context, kv dtype (0 f32, 1 bf16), seqs, queries per sequence, head_dim, heads, kv heads.
void BM_Attention(benchmark::State& state) {
  const int64_t ctx = state.range(0), seqs = state.range(2), chunk = state.range(3);
  const DType dtype = state.range(1) == 1 ? DType::kBF16 : DType::kF32;
  const int64_t heads = state.range(5), kv_heads = state.range(6), hd = state.range(4), bs = 16;
  const int64_t blocks_per_seq = (ctx + bs - 1) / bs;
  PagedKvLayer kv;
  kv.dtype = dtype;
  kv.block_size = bs;
  kv.num_kv_heads = kv_heads;
  kv.head_dim = hd;
  const int64_t num_blocks = blocks_per_seq * seqs;
  std::vector<uint8_t> cache(num_blocks * kv.block_stride_elems() * DTypeSize(dtype));
  kv.base = cache.data();
  std::vector<int32_t> tables(num_blocks);
  std::mt19937 rng(3);
  for (int64_t i = 0; i < num_blocks; ++i) tables[i] = static_cast<int32_t>(i);
  std::shuffle(tables.begin(), tables.end(), rng);
  // Fill the cache through WriteKv.
  const auto kvals = Random(kv_heads * hd, 4);
  std::vector<int64_t> slots(1);
  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t p = 0; p < ctx; ++p) {
      slots[0] = tables[s * blocks_per_seq + p / bs] * bs + p % bs;
      WriteKv(kvals.data(), 0, kvals.data(), 0, 1, slots.data(), kv);
    }
  }
  // `chunk` queries per sequence at the last positions (1: decode; more: a causal prefill chunk).
  std::vector<AttentionQuery> queries;
  double positions = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t c = chunk - 1; c >= 0; --c) {
      queries.push_back(
          {static_cast<int64_t>(queries.size()), ctx - c, tables.data() + s * blocks_per_seq});
      positions += static_cast<double>(ctx - c);
    }
  }
  const int64_t nq = static_cast<int64_t>(queries.size());
  const auto q = Random(nq * heads * hd, 5);
  std::vector<float> out(nq * heads * hd);
  ThreadPool* pool = Pool(DefaultComputeThreads());
  BestTime best;
  for (auto _ : state) {
    best.Start();
    PagedAttention(q.data(), heads * hd, queries.data(), nq, heads, kv, 0, out.data(), heads * hd,
                   pool);
    best.Stop();
    benchmark::DoNotOptimize(out.data());
  }
  // K and V bytes read (each query reads its whole context) and multiply-add flops.
  const double kv_bytes = 2.0 * positions * kv_heads * hd * DTypeSize(dtype);
  const double flops = 4.0 * positions * heads * hd;
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["KV_GBps"] =
      benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["best_KV_GBps"] = kv_bytes * 1e-9 / best.seconds;
  state.counters["best_GFLOPs"] = flops * 1e-9 / best.seconds;
  state.SetLabel(SimdLevelName(ActiveSimdLevel()));
}

BENCHMARK(BM_Attention)
    ->Name("AttentionDecode")
    ->ArgNames({"ctx", "bf16", "seqs", "chunk", "hd", "heads", "kvh"})
    ->Args({512, 0, 4, 1, 128, 32, 8})
    ->Args({2048, 0, 4, 1, 128, 32, 8})
    ->Args({512, 1, 4, 1, 128, 32, 8})
    ->Args({2048, 1, 4, 1, 128, 32, 8})
    ->Args({512, 1, 16, 1, 64, 32, 8})   // llama-1b's heads, a decode batch
    ->Args({192, 1, 16, 1, 64, 12, 12})  // llama-110m's, a serving wave's decode step
    ->Args({192, 1, 64, 1, 64, 12, 12})  // the same from memory (past the last-level cache)
    ->UseRealTime();
BENCHMARK(BM_Attention)
    ->Name("AttentionPrefill")
    ->ArgNames({"ctx", "bf16", "seqs", "chunk", "hd", "heads", "kvh"})
    ->Args({512, 0, 1, 512, 128, 32, 8})
    ->Args({512, 1, 1, 512, 128, 32, 8})
    ->Args({512, 1, 1, 512, 64, 32, 8})  // llama-1b's heads
    ->Args({2048, 1, 1, 512, 64, 32, 8})
    ->Args({512, 1, 1, 512, 64, 12, 12})  // llama-110m's heads (no GQA)
    ->Args({128, 1, 1, 128, 64, 12, 12})
    ->UseRealTime();

}  // namespace
}  // namespace tandem::cpu

BENCHMARK_MAIN();
