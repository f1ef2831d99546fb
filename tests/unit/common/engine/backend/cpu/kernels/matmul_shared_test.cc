// MatMulShared (several projections of one input in one call) equals one MatMul per projection
// bit for bit: every weight format and input dtype, column counts that split the shared column
// range mid-tile, bias or none, with and without threads, and projections whose inputs cannot be
// prepared once (mixed input dtypes or int4 groups), for every SIMD level this CPU supports.

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "tests/unit/common/engine/backend/cpu/kernels/kernel_test_util.h"
#include "tests/unit/common/engine/backend/cpu/kernels/quant_test_util.h"

namespace tandem::cpu {
namespace {

using testing::MakeQuantized;
using testing::PerSimdLevelTest;
using testing::QWeights;
using testing::RandomFloats;
using testing::ToBf16;

// One projection's weights in a given format, owning their storage.
struct Weights {
  QWeights quantized;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  MatMulWeight view;
};

Weights Make(const std::string& format, int64_t N, int64_t K, DType input, uint64_t seed) {
  Weights w;
  if (format == "f32" || format == "bf16") {
    w.f32 = RandomFloats(N * K, seed);
    w.bf16 = ToBf16(w.f32);
    w.view.data = format == "f32" ? static_cast<const void*>(w.f32.data()) : w.bf16.data();
    w.view.dtype = format == "f32" ? DType::kF32 : DType::kBF16;
    w.view.input_dtype = input;
    return w;
  }
  const bool int8 = format == "int8";
  w.quantized = MakeQuantized(int8 ? WeightQuant::kInt8 : WeightQuant::kInt4, N, K,
                              int8 ? 0 : std::stoi(format.substr(6)), seed);
  w.view = w.quantized.view(input);
  return w;
}

struct Case {
  std::vector<std::string> formats;  // one per projection
  std::vector<DType> inputs;
};

class MatMulSharedTest : public PerSimdLevelTest {};

TEST_P(MatMulSharedTest, EqualsOneMatMulPerProjection) {
  const Case cases[] = {
      {{"f32", "f32", "f32"}, {DType::kF32, DType::kF32, DType::kF32}},
      {{"bf16", "bf16", "bf16"}, {DType::kBF16, DType::kBF16, DType::kBF16}},
      {{"int8", "int8"}, {DType::kBF16, DType::kBF16}},
      {{"int8", "int8", "int8"}, {DType::kI8, DType::kI8, DType::kI8}},
      {{"int4 g128", "int4 g128"}, {DType::kI8, DType::kI8}},
      {{"int4 g32", "int4 g32", "int4 g32"}, {DType::kF32, DType::kF32, DType::kF32}},
      // Inputs prepared differently: each projection on its own.
      {{"int4 g128", "int4 g64"}, {DType::kI8, DType::kI8}},
      {{"int8", "int4 g128"}, {DType::kI8, DType::kI8}},
      {{"bf16", "int8"}, {DType::kBF16, DType::kI8}},
  };
  ThreadPool pool(3);
  const int64_t K = 200;
  const int64_t Ns[] = {37, 16, 70};  // splits mid-tile, one grain, a tail
  for (const Case& c : cases) {
    for (const int64_t M : {1, 5, 40}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const std::vector<float> x = RandomFloats(M * (K + 3), 7 + M);  // row stride K + 3
        std::vector<Weights> ws;
        std::vector<std::vector<float>> bias, want, got;
        std::vector<MatMulProjection> projections;
        for (size_t i = 0; i < c.formats.size(); ++i) {
          ws.push_back(Make(c.formats[i], Ns[i], K, c.inputs[i], 100 + i));
          bias.push_back(i == 1 ? std::vector<float>() : RandomFloats(Ns[i], 200 + i));
          want.emplace_back(M * (Ns[i] + 1), -1.0f);
          got.emplace_back(M * (Ns[i] + 1), -2.0f);
        }
        for (size_t i = 0; i < ws.size(); ++i) {
          const float* b = bias[i].empty() ? nullptr : bias[i].data();
          MatMul(x.data(), M, K, K + 3, ws[i].view, Ns[i], b, want[i].data(), Ns[i] + 1, p);
          projections.push_back({ws[i].view, Ns[i], b, got[i].data(), Ns[i] + 1});
        }
        MatMulShared(x.data(), M, K, K + 3, projections.data(),
                     static_cast<int>(projections.size()), p);
        for (size_t i = 0; i < ws.size(); ++i) {
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < Ns[i]; ++n) {
              const float a = want[i][m * (Ns[i] + 1) + n], b = got[i][m * (Ns[i] + 1) + n];
              ASSERT_EQ(std::memcmp(&a, &b, sizeof(float)), 0)
                  << c.formats[i] << " projection " << i << " M=" << M << " m=" << m << " n=" << n
                  << (p ? " threads" : "") << ": " << a << " vs " << b;
            }
            ASSERT_EQ(got[i][m * (Ns[i] + 1) + Ns[i]], -2.0f) << "wrote past its columns";
          }
        }
      }
    }
  }
}

TANDEM_INSTANTIATE_PER_SIMD_LEVEL(MatMulSharedTest);

}  // namespace
}  // namespace tandem::cpu
