// The emulator's cuBLAS GEMM (cublasGemmEx over ReferenceGemm's panels) against the plain
// element-by-element loop it replaced, bit for bit: every transpose, f32 and bf16 operands,
// alpha and beta, shapes that are not multiples of the panels (64 rows, 256 columns) or of the
// four outputs computed side by side.

#include "common/cuda/emulation/reference_gemm.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/cuda/emulation/fake_cuda.h"

namespace tandem::cuda_emu {
namespace {

float ToFloatBf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

struct Operand {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  const void* data(bool bf) const {
    return bf ? static_cast<const void*>(bf16.data()) : static_cast<const void*>(f32.data());
  }
  float at(bool bf, size_t i) const { return bf ? ToFloatBf16(bf16[i]) : f32[i]; }
};

Operand RandomOperand(size_t count, std::mt19937* rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Operand o;
  for (size_t i = 0; i < count; ++i) {
    const float v = dist(*rng);
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    o.f32.push_back(v);
    o.bf16.push_back(static_cast<uint16_t>(bits >> 16));
  }
  return o;
}

TEST(ReferenceGemmTest, CublasGemmExEqualsTheElementByElementLoop) {
  std::mt19937 rng(7);
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {67, 3, 33}, {130, 9, 64}, {5, 260, 17}};
  for (const auto& shape : shapes) {
    const int m = shape[0], n = shape[1], k = shape[2];
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (const bool bf : {false, true}) {
          for (const float beta : {0.0f, 0.5f}) {
            SCOPED_TRACE(testing::Message() << m << "x" << n << "x" << k << " ta " << ta << " tb "
                                            << tb << " bf16 " << bf << " beta " << beta);
            const int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
            const Operand a = RandomOperand(static_cast<size_t>(lda) * (ta ? m : k), &rng);
            const Operand b = RandomOperand(static_cast<size_t>(ldb) * (tb ? k : n), &rng);
            const Operand c0 = RandomOperand(static_cast<size_t>(ldc) * n, &rng);
            std::vector<float> c = c0.f32, want = c0.f32;
            const float alpha = 1.25f;
            for (int j = 0; j < n; ++j) {
              for (int i = 0; i < m; ++i) {
                double acc = 0;
                for (int l = 0; l < k; ++l) {
                  const size_t ai =
                      ta ? l + static_cast<size_t>(i) * lda : i + static_cast<size_t>(l) * lda;
                  const size_t bi =
                      tb ? j + static_cast<size_t>(l) * ldb : l + static_cast<size_t>(j) * ldb;
                  acc += static_cast<double>(a.at(bf, ai)) * b.at(bf, bi);
                }
                float& out = want[i + static_cast<size_t>(j) * ldc];
                out = beta == 0.0f ? static_cast<float>(alpha * acc)
                                   : static_cast<float>(alpha * acc + beta * out);
              }
            }
            const cudaDataType_t type = bf ? CUDA_R_16BF : CUDA_R_32F;
            ASSERT_EQ(
                cublasGemmEx(handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                             m, n, k, &alpha, a.data(bf), type, lda, b.data(bf), type, ldb, &beta,
                             c.data(), CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                CUBLAS_STATUS_SUCCESS);
            ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
            EXPECT_EQ(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)), 0);
          }
        }
      }
    }
  }
  cublasDestroy(handle);
}

// f32 sums (the cuBLASLt fp8 path's): each output's chain in order, whatever its position among
// the four side by side or the panels. bf16 operands, so every product is exact in f32 (as the
// fp8 codes' are) and only the order of the sums can show.
TEST(ReferenceGemmTest, FloatSumsRunInOrderPerOutput) {
  std::mt19937 rng(11);
  const int64_t m = 70, n = 259, k = 45;
  const Operand a = RandomOperand(m * k, &rng), b = RandomOperand(k * n, &rng);
  std::vector<float> got(m * n, -1.0f);
  ReferenceGemm<float>(
      m, n, k, [&](int64_t i, int64_t l) { return a.at(true, i * k + l); },
      [&](int64_t l, int64_t j) { return b.at(true, j * k + l); },
      [&](int64_t i, int64_t j, float s) { got[j * m + i] = s; });
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      volatile float s = 0.0f;  // no contraction or reordering in the reference
      for (int64_t l = 0; l < k; ++l) {
        const float p = a.at(true, i * k + l) * b.at(true, j * k + l);
        s = s + p;
      }
      ASSERT_EQ(std::memcmp(&got[j * m + i], const_cast<float*>(&s), sizeof(float)), 0)
          << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace tandem::cuda_emu
