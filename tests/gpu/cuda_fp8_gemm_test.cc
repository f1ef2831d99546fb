// The FP8 tensor-core GEMM (fp8_gemm.h) below the backend: the per-token activation quantization
// kernel against a CPU reference (bit for bit), and products over fp8 weights through Gemm, in
// both scale modes (cuBLASLt's outer-vector scales, unit scales + the row / column scaling kernel),
// against a float64 reference of the same quantized operands; the shapes it leaves to the
// weight-only path. Outputs are poisoned (NaN) before each launch so an unwritten element fails.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/base/quant.h"
#include "common/engine/backend/cuda/fp8_gemm.h"
#include "common/engine/backend/cuda/gemm.h"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/quant_kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::gpu_testing {
namespace {

class CudaFp8GemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_REQUIRE_GPU();
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    device_mode_ = cuda::Fp8ScaleModeFor(major, minor);
  }
  // The scale modes this device runs: the epilogue everywhere from sm_89, the outer-vector
  // scales on sm_90 (the emulator reports 9.0).
  std::vector<cuda::Fp8ScaleMode> Modes() const {
    std::vector<cuda::Fp8ScaleMode> modes;
    if (!device_mode_.has_value()) return modes;
    if (*device_mode_ == cuda::Fp8ScaleMode::kOuterVector) {
      modes.push_back(cuda::Fp8ScaleMode::kOuterVector);
    }
    modes.push_back(cuda::Fp8ScaleMode::kEpilogue);
    return modes;
  }
  std::optional<cuda::Fp8ScaleMode> device_mode_;
  cudaStream_t stream_ = nullptr;
};

// The CPU reference of QuantizeActivationsFp8 (quant_kernels.h): per row, s = max(max|x| / 448,
// kFp8MinActivationScale), codes e4m3(x / s) by quant.h's host conversion.
void QuantizeRowsReference(const std::vector<float>& x, int64_t M, int64_t k, int64_t ldx,
                           std::vector<uint8_t>* codes, std::vector<float>* scales) {
  codes->assign(M * k, 0);
  scales->assign(M, 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(x[m * ldx + c]));
    const float s = std::max(amax / 448.0f, cuda::kFp8MinActivationScale);
    (*scales)[m] = s;
    for (int64_t c = 0; c < k; ++c) (*codes)[m * k + c] = Fp8E4M3Code(x[m * ldx + c] / s);
  }
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Activations with the cases that matter to the scale: a row of zeros (the floor), a row of tiny
// values (under the floor), rows with an outlier 100 times the rest, and plain random rows.
std::vector<float> TestActivations(int64_t M, int64_t ldx, uint64_t seed) {
  std::vector<float> x = RandomFloats(M * ldx, seed, -3.0f, 3.0f);
  for (int64_t c = 0; c < ldx; ++c) {
    x[c] = 0.0f;
    if (M > 1) x[ldx + c] *= 1e-7f;
  }
  for (int64_t m = 2; m < M; m += 3) x[m * ldx + (m * 7) % ldx] *= 100.0f;
  return x;
}

// Bit for bit, f32 and bf16 activations, row strides beyond K, K not a multiple of 32.
TEST_F(CudaFp8GemmTest, ActivationQuantizationMatchesCpuReference) {
  struct Shape {
    int64_t M, k, ldx;
  };
  for (const Shape sh : {Shape{1, 64, 64}, Shape{13, 200, 208}, Shape{40, 1024, 1030}}) {
    for (bool x_bf16 : {false, true}) {
      std::vector<float> x = TestActivations(sh.M, sh.ldx, sh.M * 31 + sh.k);
      if (x_bf16) {
        for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));  // the values the kernel reads
      }
      std::vector<uint8_t> want_codes;
      std::vector<float> want_scales;
      QuantizeRowsReference(x, sh.M, sh.k, sh.ldx, &want_codes, &want_scales);
      DeviceArray<float> dx(x), scales(sh.M);
      DeviceArray<uint16_t> dx16(ToBf16(x));
      DeviceArray<uint8_t> codes(sh.M * sh.k);
      codes.Poison();
      scales.Poison();
      const void* in = x_bf16 ? static_cast<const void*>(dx16.get()) : dx.get();
      TANDEM_CUDA_CHECK(cuda::QuantizeActivationsFp8(in, x_bf16, sh.ldx, sh.M, sh.k, codes.get(),
                                                     scales.get(), stream_));
      const std::string what =
          "M=" + std::to_string(sh.M) + " k=" + std::to_string(sh.k) + (x_bf16 ? " bf16" : " f32");
      EXPECT_EQ(codes.Download(), want_codes) << what;
      const std::vector<float> got_scales = scales.Download();
      for (int64_t m = 0; m < sh.M; ++m) {
        EXPECT_EQ(Bits(got_scales[m]), Bits(want_scales[m])) << what << " row " << m;
      }
      EXPECT_EQ(want_scales[0], cuda::kFp8MinActivationScale);  // the zero row takes the floor
    }
  }
}

// Random fp8 weight codes (every finite code) and per-row scales.
struct Fp8Weights {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
Fp8Weights RandomFp8Weights(int64_t n, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Fp8Weights w;
  w.codes.resize(n * k);
  for (uint8_t& c : w.codes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xff);
    } while ((c & 0x7f) == 0x7f);  // NaN codes: never written by a quantizer
  }
  w.scales = RandomFloats(n, seed + 1, 1e-3f, 2e-2f);
  return w;
}

// Products of more than kGemvMaxRows rows through Gemm with the FP8 GEMM enabled, against the
// float64 sum of the same quantized operands (weight codes, and the activations' codes and scales
// from the reference above) times both scales. Bound: the emulator sums the exact products in f32
// (K - 1 roundings) and rounds twice more for the scales, so |error| <= (K + 2) 2^-24 sum |terms|;
// on a GPU the FP8 tensor cores accumulate with fewer bits between cuBLAS's promotions to f32:
// 2^-10 sum |terms|. In the emulator both scale modes give the same bits.
TEST_F(CudaFp8GemmTest, GemmMatchesFloat64Reference) {
  if (Modes().empty()) GTEST_SKIP() << "no FP8 tensor cores on this device";
  struct Shape {
    int64_t M, n, k, ldx, ldy;
  };
  for (const Shape sh :
       {Shape{9, 48, 64, 64, 48}, Shape{33, 200, 256, 264, 204}, Shape{100, 96, 512, 512, 100}}) {
    const Fp8Weights w = RandomFp8Weights(sh.n, sh.k, sh.n + sh.k);
    DeviceArray<uint8_t> dcodes(w.codes);
    DeviceArray<float> dscales(w.scales);
    for (bool x_bf16 : {false, true}) {
      std::vector<float> x = TestActivations(sh.M, sh.ldx, sh.M + 7);
      if (x_bf16) {
        for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));
      }
      std::vector<uint8_t> qx;
      std::vector<float> sx;
      QuantizeRowsReference(x, sh.M, sh.k, sh.ldx, &qx, &sx);
      std::vector<double> want(sh.M * sh.n), bound(sh.M * sh.n);
      for (int64_t m = 0; m < sh.M; ++m) {
        for (int64_t j = 0; j < sh.n; ++j) {
          double sum = 0, abs_sum = 0;
          for (int64_t c = 0; c < sh.k; ++c) {
            const double p = static_cast<double>(Fp8E4M3Value(w.codes[j * sh.k + c])) *
                             Fp8E4M3Value(qx[m * sh.k + c]);
            sum += p;
            abs_sum += std::fabs(p);
          }
          const double s = static_cast<double>(w.scales[j]) * sx[m];
          want[m * sh.n + j] = sum * s;
          const double rel = kEmulated ? (sh.k + 2) * 0x1p-24 : 0x1p-10;
          bound[m * sh.n + j] = rel * abs_sum * s + 1e-30;
        }
      }
      DeviceArray<float> dx(x), y(sh.M * sh.ldy);
      DeviceArray<uint16_t> dx16(ToBf16(x));
      std::vector<float> first;
      for (cuda::Fp8ScaleMode mode : Modes()) {
        cuda::Gemm gemm;
        ASSERT_TRUE(gemm.Init(stream_).ok());
        ASSERT_TRUE(gemm.EnableFp8(mode).ok());
        ASSERT_TRUE(gemm.ReserveFp8(128, 512).ok());
        cuda::DeviceMatrix dw{dcodes.get(), DType::kBF16, sh.n, sh.k};
        dw.quant = WeightQuant::kFp8;
        dw.scales = dscales.get();
        const cuda::GemmInput in{x_bf16 ? static_cast<const void*>(dx16.get()) : dx.get(), x_bf16,
                                 sh.ldx};
        y.Poison();
        const absl::Status st = gemm.Run(in, sh.M, dw, y.get(), sh.ldy);
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_EQ(gemm.fp8_calls(), 1);
        EXPECT_EQ(gemm.gemv_calls() + gemm.cublas_calls(), 0);
        const std::vector<float> got = y.Download();
        const std::string what =
            "M=" + std::to_string(sh.M) + " n=" + std::to_string(sh.n) +
            " k=" + std::to_string(sh.k) + (x_bf16 ? " bf16" : " f32") +
            (mode == cuda::Fp8ScaleMode::kOuterVector ? " outer-vector" : " epilogue");
        double worst = 0;
        for (int64_t m = 0; m < sh.M; ++m) {
          for (int64_t j = 0; j < sh.n; ++j) {
            const double g = got[m * sh.ldy + j], e = want[m * sh.n + j];
            ASSERT_TRUE(std::isfinite(g)) << what;
            ASSERT_LE(std::fabs(g - e), bound[m * sh.n + j]) << what << " at " << m << ", " << j;
            worst = std::max(worst, std::fabs(g - e) / bound[m * sh.n + j]);
          }
        }
        std::printf("%s: worst error %.3g of the bound\n", what.c_str(), worst);
        std::vector<float> rows;
        for (int64_t m = 0; m < sh.M; ++m) {
          rows.insert(rows.end(), got.begin() + m * sh.ldy, got.begin() + m * sh.ldy + sh.n);
        }
        if (first.empty()) {
          first = rows;
        } else if (kEmulated) {
          EXPECT_EQ(rows, first) << what;  // the same arithmetic, scales in either place
        }
      }
    }
  }
}

// What the FP8 GEMM leaves to the weight-only path: up to kGemvMaxRows rows (the GEMV), K not a
// multiple of 16 (cuBLASLt's FP8 alignment; dequantized tiles + cuBLAS), rows beyond the scratch,
// and a Gemm without EnableFp8. Each result is still the product (checked against the
// weight-only arithmetic's float64 value, within the existing f32 bound).
TEST_F(CudaFp8GemmTest, ShapesItDoesNotTakeStayWeightOnly) {
  if (Modes().empty()) GTEST_SKIP() << "no FP8 tensor cores on this device";
  struct Case {
    int64_t M, n, k;
    bool enable;
  };
  for (const Case c : {Case{8, 40, 64, true}, Case{20, 40, 72, true}, Case{200, 40, 64, true},
                       Case{20, 40, 64, false}}) {
    const Fp8Weights w = RandomFp8Weights(c.n, c.k, c.M + c.n + c.k);
    const std::vector<float> x = RandomFloats(c.M * c.k, c.M + 3, -2.0f, 2.0f);
    DeviceArray<uint8_t> dcodes(w.codes);
    DeviceArray<float> dscales(w.scales), dx(x), y(c.M * c.n);
    DeviceArray<uint8_t> dequant(c.n * c.k * 4);
    cuda::Gemm gemm;
    ASSERT_TRUE(gemm.Init(stream_).ok());
    if (c.enable) {
      ASSERT_TRUE(gemm.EnableFp8(Modes().front()).ok());
      ASSERT_TRUE(gemm.ReserveFp8(128, 512).ok());
    }
    cuda::DeviceMatrix dw{dcodes.get(), DType::kBF16, c.n, c.k};
    dw.quant = WeightQuant::kFp8;
    dw.scales = dscales.get();
    dw.dequant = dequant.get();
    dw.dequant_bytes = c.n * c.k * 4;
    y.Poison();
    const absl::Status st = gemm.Run({dx.get(), false, c.k}, c.M, dw, y.get(), c.n);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(gemm.fp8_calls(), 0) << c.M << " x " << c.k;
    EXPECT_EQ(gemm.gemv_calls() + gemm.cublas_calls() > 0, true);
    std::vector<float> want(c.M * c.n);
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < c.k; ++k) {
          sum += static_cast<double>(x[m * c.k + k]) * Fp8E4M3Value(w.codes[j * c.k + k]);
        }
        want[m * c.n + j] = static_cast<float>(sum * w.scales[j]);
      }
    }
    ExpectClose(y.Download(), want, 2e-5, "weight-only M=" + std::to_string(c.M));
  }
}

}  // namespace
}  // namespace tandem::gpu_testing
