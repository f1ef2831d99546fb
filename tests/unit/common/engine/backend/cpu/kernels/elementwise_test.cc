// Row-wise kernels (RmsNorm, AddRmsNorm, ApplyRope, SiluMul, Embed) and the vector exp against
// double-precision references, for every SIMD level this CPU supports.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/base/half.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "tests/unit/common/engine/backend/cpu/kernels/kernel_test_util.h"

namespace tandem::cpu {
namespace {

using testing::PerSimdLevelTest;
using testing::RandomFloats;

class ElementwiseTest : public PerSimdLevelTest {};

void ExpectRmsNorm(const std::vector<float>& x, const std::vector<float>& w, int64_t M, int64_t D,
                   float eps, const std::vector<float>& out) {
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(x[m * D + d]) * x[m * D + d];
    const double inv = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t d = 0; d < D; ++d) {
      const double want = x[m * D + d] * inv * w[d];
      ASSERT_NEAR(out[m * D + d], want, 1e-6 * std::fabs(want) + 1e-7) << "m=" << m << " d=" << d;
    }
  }
}

TEST_P(ElementwiseTest, RmsNorm) {
  for (int64_t D : {1, 7, 16, 64, 100, 2049}) {
    const int64_t M = 5;
    const auto x = RandomFloats(M * D, D, -3.0f, 3.0f);
    const auto w = RandomFloats(D, D + 1, 0.5f, 1.5f);
    std::vector<float> out(M * D);
    RmsNorm(x.data(), w.data(), M, D, 1e-5f, out.data());
    ExpectRmsNorm(x, w, M, D, 1e-5f, out);
    // In place, and row-independent: each row alone gives the same bits.
    std::vector<float> inplace = x;
    RmsNorm(inplace.data(), w.data(), M, D, 1e-5f, inplace.data());
    EXPECT_EQ(0, std::memcmp(inplace.data(), out.data(), out.size() * sizeof(float)));
    std::vector<float> row(D);
    for (int64_t m = 0; m < M; ++m) {
      RmsNorm(x.data() + m * D, w.data(), 1, D, 1e-5f, row.data());
      ASSERT_EQ(0, std::memcmp(row.data(), out.data() + m * D, D * sizeof(float)));
    }
  }
}

TEST_P(ElementwiseTest, AddRmsNorm) {
  for (int64_t D : {3, 64, 257}) {
    const int64_t M = 4;
    auto residual = RandomFloats(M * D, 2 * D);
    const auto delta = RandomFloats(M * D, 2 * D + 1);
    const auto w = RandomFloats(D, 2 * D + 2, 0.5f, 1.5f);
    std::vector<float> sum(M * D), out(M * D);
    for (int64_t i = 0; i < M * D; ++i) sum[i] = residual[i] + delta[i];
    AddRmsNorm(residual.data(), delta.data(), w.data(), M, D, 1e-6f, out.data());
    EXPECT_EQ(0, std::memcmp(residual.data(), sum.data(), sum.size() * sizeof(float)));
    ExpectRmsNorm(sum, w, M, D, 1e-6f, out);
    // Same bits as RmsNorm of the updated residual.
    std::vector<float> out2(M * D);
    RmsNorm(sum.data(), w.data(), M, D, 1e-6f, out2.data());
    EXPECT_EQ(0, std::memcmp(out.data(), out2.data(), out.size() * sizeof(float)));
  }
}

TEST_P(ElementwiseTest, ApplyRope) {
  const int64_t M = 3, H = 4, hd = 64, half = hd / 2, max_pos = 50, ldx = H * hd + 5;
  std::vector<float> cos_sin(max_pos * half * 2);
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(10000.0, -2.0 * i / hd);
      cos_sin[(p * half + i) * 2] = static_cast<float>(std::cos(p * inv_freq));
      cos_sin[(p * half + i) * 2 + 1] = static_cast<float>(std::sin(p * inv_freq));
    }
  }
  const int32_t pos[M] = {0, 17, 49};
  auto x = RandomFloats(M * ldx, 5);
  const auto x0 = x;
  ApplyRope(x.data(), M, ldx, H, hd, pos, cos_sin.data());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const double c = cos_sin[(pos[m] * half + i) * 2], s = cos_sin[(pos[m] * half + i) * 2 + 1];
        const double a = x0[m * ldx + h * hd + i], b = x0[m * ldx + h * hd + i + half];
        EXPECT_NEAR(x[m * ldx + h * hd + i], a * c - b * s, 1e-6);
        EXPECT_NEAR(x[m * ldx + h * hd + i + half], b * c + a * s, 1e-6);
      }
    }
    for (int64_t j = H * hd; j < ldx; ++j) EXPECT_EQ(x[m * ldx + j], x0[m * ldx + j]);
  }
}

TEST_P(ElementwiseTest, SiluMul) {
  for (int64_t F : {1, 15, 16, 33, 1000}) {
    const int64_t M = 3;
    auto gate = RandomFloats(M * F, F, -20.0f, 20.0f);
    const auto up = RandomFloats(M * F, F + 1, -2.0f, 2.0f);
    if (F == 1000) {  // extremes: exp(-g) overflows or underflows
      gate[0] = -100.0f;
      gate[1] = 100.0f;
      gate[2] = -89.5f;
      gate[3] = 0.0f;
    }
    std::vector<float> out(M * F);
    SiluMul(gate.data(), up.data(), M, F, out.data());
    for (int64_t i = 0; i < M * F; ++i) {
      const double g = gate[i];
      const double want = g / (1.0 + std::exp(-g)) * up[i];
      ASSERT_NEAR(out[i], want, 4e-7 * std::fabs(want) + 1e-30) << "i=" << i << " g=" << g;
    }
  }
}

// Big enough calls split their rows over the pool: the same bits as the caller alone.
TEST_P(ElementwiseTest, RowOpsOnAPoolMatchTheCallerAlone) {
  ThreadPool pool(3);
  const int64_t M = 67, D = 2048, H = 32, hd = 64, half = hd / 2, max_pos = 80;
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const auto x = RandomFloats(M * D, 1, -3.0f, 3.0f), delta = RandomFloats(M * D, 2);
  const auto w = RandomFloats(D, 3, 0.5f, 1.5f);
  std::vector<float> alone(M * D), pooled(M * D);
  RmsNorm(x.data(), w.data(), M, D, 1e-5f, alone.data());
  RmsNorm(x.data(), w.data(), M, D, 1e-5f, pooled.data(), &pool);
  EXPECT_TRUE(same(alone, pooled)) << "RmsNorm";

  std::vector<float> r_alone = x, r_pooled = x;
  AddRmsNorm(r_alone.data(), delta.data(), w.data(), M, D, 1e-5f, alone.data());
  AddRmsNorm(r_pooled.data(), delta.data(), w.data(), M, D, 1e-5f, pooled.data(), &pool);
  EXPECT_TRUE(same(r_alone, r_pooled) && same(alone, pooled)) << "AddRmsNorm";

  SiluMul(x.data(), delta.data(), M, D, alone.data());
  SiluMul(x.data(), delta.data(), M, D, pooled.data(), &pool);
  EXPECT_TRUE(same(alone, pooled)) << "SiluMul";

  std::vector<float> cos_sin(max_pos * half * 2);
  for (size_t i = 0; i < cos_sin.size(); ++i) cos_sin[i] = std::cos(0.01f * static_cast<float>(i));
  std::vector<int32_t> pos(M);
  for (int64_t m = 0; m < M; ++m) pos[m] = static_cast<int32_t>((m * 37) % max_pos);
  std::vector<float> q_alone = x, q_pooled = x;  // [M, H * hd] = [M, D]
  ApplyRope(q_alone.data(), M, D, H, hd, pos.data(), cos_sin.data());
  ApplyRope(q_pooled.data(), M, D, H, hd, pos.data(), cos_sin.data(), &pool);
  EXPECT_TRUE(same(q_alone, q_pooled)) << "ApplyRope";
  EXPECT_FALSE(same(q_alone, x));

  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    PagedKvLayer kv;
    kv.dtype = dtype;
    kv.num_kv_heads = H / 2;
    kv.head_dim = hd;
    const int64_t blocks = (M + kv.block_size - 1) / kv.block_size + 1;
    const size_t bytes = blocks * kv.block_stride_elems() * DTypeSize(dtype);
    std::vector<uint8_t> kv_alone(bytes, 0xee), kv_pooled(bytes, 0xee);
    std::vector<int64_t> slots(M);
    for (int64_t m = 0; m < M; ++m) slots[m] = (m * 5) % (blocks * kv.block_size);  // distinct
    slots[3] = -1;                                                                  // skipped
    const int64_t ld = kv.num_kv_heads * hd;
    kv.base = kv_alone.data();
    WriteKv(x.data(), ld, delta.data(), ld, M, slots.data(), kv);
    kv.base = kv_pooled.data();
    WriteKv(x.data(), ld, delta.data(), ld, M, slots.data(), kv, &pool);
    EXPECT_EQ(kv_alone, kv_pooled) << "WriteKv " << DTypeName(dtype);
  }
}

TEST_P(ElementwiseTest, EmbedF32AndBf16) {
  const int64_t vocab = 10, D = 37;
  const auto table = RandomFloats(vocab * D, 9);
  const auto table_bf16 = testing::ToBf16(table);
  const int32_t ids[4] = {3, 0, 9, 3};
  std::vector<float> out(4 * D);
  Embed(ids, 4, table.data(), DType::kF32, D, out.data());
  for (int m = 0; m < 4; ++m) {
    for (int64_t d = 0; d < D; ++d) ASSERT_EQ(out[m * D + d], table[ids[m] * D + d]);
  }
  Embed(ids, 4, table_bf16.data(), DType::kBF16, D, out.data());
  for (int m = 0; m < 4; ++m) {
    for (int64_t d = 0; d < D; ++d)
      ASSERT_EQ(out[m * D + d], Bf16ToFloat(table_bf16[ids[m] * D + d]));
  }
}

// Error in units in the last place of the (float) reference.
double Ulps(float got, double want) {
  int e;
  std::frexp(want, &e);
  const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  return std::fabs(got - want) / ulp;
}

TEST_P(ElementwiseTest, VectorExpWithinTwoUlps) {
  std::vector<float> x;
  for (float v = -103.0f; v <= 88.7f; v += 0.0137f) x.push_back(v);
  for (float v : RandomFloats(10000, 5, -1.0f, 1.0f)) x.push_back(v);
  for (float v : RandomFloats(10000, 6, -1e-6f, 1e-6f)) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  x.insert(x.end(), {0.0f, -0.0f, -inf, inf, 88.72f, 89.0f, -87.33f, -104.0f, -200.0f});
  std::vector<float> y(x.size());
  internal::ActiveKernels().exp(x.data(), static_cast<int64_t>(x.size()), y.data());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    if (std::isinf(static_cast<float>(want))) {
      EXPECT_TRUE(std::isinf(y[i]) && y[i] > 0) << "x=" << x[i];
      continue;
    }
    worst = std::max(worst, Ulps(y[i], want));
    ASSERT_LE(Ulps(y[i], want), 2.0) << "x=" << x[i] << " got " << y[i] << " want " << want;
  }
  EXPECT_EQ(y[x.size() - 7], 0.0f);  // exp(-inf)
  RecordProperty("worst_ulps", std::to_string(worst));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float out_nan;
  internal::ActiveKernels().exp(&nan, 1, &out_nan);
  EXPECT_TRUE(std::isnan(out_nan));
}

TANDEM_INSTANTIATE_PER_SIMD_LEVEL(ElementwiseTest);

}  // namespace
}  // namespace tandem::cpu
