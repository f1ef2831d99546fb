// Quantized MatMul with bf16 (or f32) vs int8 inputs, side by side in one process: for int8 and
// int4 (group --group) weights at llama-1b's projection shapes, each M, the two input dtypes
// alternate over `reps` rounds on cold weights (copies cycled past the last-level cache); prints
// the median milliseconds per call, the ratio other / int8 (above 1: int8 inputs faster) and the
// int8 path's weight stream in GB/s (its own bytes: codes, scales, zeros; compare with `membw`).
// Runs at the active tier (TANDEM_SIMD to force one).
//   matmul_inputs_bench [--threads 2] [--reps 9] [--m 1,4,8,16,32,128] [--group 128]
//                       [--other bf16|f32]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/model/quantize.h"

namespace tandem {
namespace {

constexpr int64_t kColdBytes = int64_t{256} << 20;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(int threads, int reps, const std::vector<int64_t>& ms, int64_t group, DType other) {
  ThreadPool pool(threads);
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  const Shape shapes[] = {{"gate/up 8192x2048", 8192, 2048}, {"down 2048x8192", 2048, 8192}};
  const char* on = other == DType::kF32 ? "f32" : "bf16";
  std::printf("tier %s\n", cpu::ActiveTierName().c_str());
  std::printf("| weights | shape | M | %s inputs ms | int8 inputs ms | %s / int8 | int8 GB/s |\n",
              on, on);
  std::printf("|---|---|---:|---:|---:|---:|---:|\n");
  for (WeightQuant quant : {WeightQuant::kInt8, WeightQuant::kInt4}) {
    for (const Shape& s : shapes) {
      std::vector<float> f(s.N * s.K);
      for (int64_t i = 0; i < s.N * s.K; ++i) {
        f[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
      }
      const QuantizedMatrix q = Quantize(
          quant, s.N, s.K, group,
          [&](int64_t n, float* row) { std::memcpy(row, f.data() + n * s.K, s.K * 4); }, nullptr);
      const int copies =
          static_cast<int>(std::max<int64_t>(1, kColdBytes / static_cast<int64_t>(q.codes.size())));
      QuantizedMatrix tiles = q;  // int8 inputs take WeightLayout::kTiles16
      ToTiles16(&tiles);
      std::vector<QuantizedMatrix> cold(copies, q), cold_i8(copies, tiles);
      for (int64_t M : ms) {
        std::vector<float> x(M * s.K), y(M * s.N);
        for (int64_t i = 0; i < M * s.K; ++i) x[i] = static_cast<float>((i * 7919) % 100) / 50 - 1;
        std::vector<double> t[2];
        int c = 0;
        for (int r = 0; r < reps; ++r) {
          for (int which = 0; which < 2; ++which) {
            const QuantizedMatrix& w = which == 0 ? cold[c] : cold_i8[c];
            c = (c + 1) % copies;
            cpu::MatMulWeight mw;
            mw.data = w.codes.data();
            mw.quant = quant;
            mw.scales = w.scales.data();
            mw.zeros = w.zeros.empty() ? nullptr : w.zeros.data();
            mw.group_size = group;
            mw.layout = w.layout;
            mw.input_dtype = which == 0 ? other : DType::kI8;
            const auto t0 = std::chrono::steady_clock::now();
            cpu::MatMul(x.data(), M, s.K, s.K, mw, s.N, nullptr, y.data(), s.N, &pool);
            t[which].push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
          }
        }
        const double b = Median(t[0]), i8 = Median(t[1]);
        const double bytes = static_cast<double>(tiles.codes.size() + 4 * tiles.scales.size() +
                                                 4 * tiles.zeros.size());
        const std::string name =
            quant == WeightQuant::kInt8 ? "int8" : "int4 g" + std::to_string(group);
        std::printf("| %s | %s | %lld | %.3f | %.3f | %.2fx | %.1f |\n", name.c_str(), s.name,
                    static_cast<long long>(M), b, i8, b / i8, bytes / i8 / 1e6);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  int threads = 2, reps = 9;
  int64_t group = 128;
  tandem::DType other = tandem::DType::kBF16;
  std::vector<int64_t> ms = {1, 4, 8, 16, 32, 128};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--threads") {
      threads = std::stoi(value);
    } else if (flag == "--group") {
      group = std::stoll(value);
    } else if (flag == "--other") {
      other = value == "f32" ? tandem::DType::kF32 : tandem::DType::kBF16;
    } else if (flag == "--reps") {
      reps = std::stoi(value);
    } else if (flag == "--m") {
      ms.clear();
      for (absl::string_view p : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int64_t v;
        if (absl::SimpleAtoi(p, &v) && v > 0) ms.push_back(v);
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (threads < 1 || reps < 1 || ms.empty()) {
    std::fprintf(stderr, "bad --threads / --reps / --m\n");
    return 2;
  }
  return tandem::Run(threads, reps, ms, group, other);
}
