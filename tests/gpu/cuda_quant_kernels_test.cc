// The quantized-weight kernels (quant_gemv_kernels.cu) and the products over quantized weights
// (gemm.h) against the CPU MatMul over the same int8 / int4 / fp8 matrices (made by the loader's
// quantizer), with f32 inputs as they are and bf16 inputs as the CPU's bf16-input path rounds
// them. Outputs are poisoned (NaN) before each launch so an unwritten element fails.

#include <algorithm>
#include <string>
#include <vector>

#include "common/base/quant.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cuda/gemm.h"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/quant_kernels.h"
#include "common/engine/model/quantize.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::gpu_testing {
namespace {

class CudaQuantKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_REQUIRE_GPU(); }
  cudaStream_t stream_ = nullptr;
};

// One weight format of the tests: int8, fp8, or int4 with a group size.
struct Format {
  WeightQuant quant;
  int64_t group;
  std::string Name() const {
    return quant == WeightQuant::kInt4 ? "int4 g" + std::to_string(group)
                                       : std::string(WeightQuantName(quant));
  }
};
const Format kFormats[] = {{WeightQuant::kInt8, 0},
                           {WeightQuant::kInt4, 32},
                           {WeightQuant::kInt4, 128},
                           {WeightQuant::kFp8, 0}};

// A random [n, k] matrix quantized by the loader's quantizer (kRows).
QuantizedMatrix MakeMatrix(const Format& f, int64_t n, int64_t k, uint64_t seed) {
  const std::vector<float> w = RandomFloats(n * k, seed, -0.5, 0.5);
  return Quantize(
      f.quant, n, k, f.group,
      [&](int64_t row, float* out) {
        std::copy(w.begin() + row * k, w.begin() + (row + 1) * k, out);
      },
      nullptr);
}

// The scales in the CUDA layout (quant_kernels.h: int4 as (scale, zero) pairs).
std::vector<float> DeviceScales(const QuantizedMatrix& m) {
  if (m.quant != WeightQuant::kInt4) return m.scales;
  std::vector<float> pairs(2 * m.scales.size());
  for (size_t i = 0; i < m.scales.size(); ++i) {
    pairs[2 * i] = m.scales[i];
    pairs[2 * i + 1] = m.zeros[i];
  }
  return pairs;
}

// The CPU's y = x W^T (f32 or bf16 inputs) over the quantized matrix.
std::vector<float> CpuProduct(const QuantizedMatrix& m, const std::vector<float>& x, int64_t rows,
                              int64_t ldx, bool x_bf16) {
  cpu::MatMulWeight w;
  w.data = m.codes.data();
  w.quant = m.quant;
  w.scales = m.scales.data();
  w.zeros = m.quant == WeightQuant::kInt4 ? m.zeros.data() : nullptr;
  w.group_size = m.group_size;
  w.layout = WeightLayout::kRows;
  w.input_dtype = x_bf16 ? DType::kBF16 : DType::kF32;
  std::vector<float> y(rows * m.rows);
  cpu::MatMul(x.data(), rows, m.cols, ldx, w, m.rows, nullptr, y.data(), m.rows, nullptr);
  return y;
}

// The quantized GEMV against the CPU MatMul for every format, row count it takes, the 128-bit and
// the scalar shapes (K not a multiple of the chunk, odd row strides), and the fused SiLU epilogue
// (f32 and bf16 outputs). Same products; sums in another order: ~1e-6 relative.
TEST_F(CudaQuantKernelsTest, QuantGemvMatchesCpuMatMul) {
  struct Shape {
    int64_t n, k, ldx;
  };
  for (const Format& f : kFormats) {
    // K = 4608: every int4 lane takes a second round of loads after its four in flight.
    for (Shape sh :
         {Shape{37, 256, 264}, Shape{12, 1024, 1024}, Shape{9, 200, 202}, Shape{5, 4608, 4616}}) {
      for (bool x_bf16 : {false, true}) {
        for (bool silu : {false, true}) {
          for (int rows : {1, 2, 3, 8}) {
            const bool y_bf16 = silu && rows == 3;
            const int64_t n = sh.n, k = sh.k, ldx = sh.ldx, wrows = silu ? 2 * n : n;
            const int64_t ldy = n + 3;
            const QuantizedMatrix m = MakeMatrix(f, wrows, k, n + k);
            std::vector<float> x = RandomFloats(rows * ldx, rows + k, -2, 2);
            const std::vector<float> prod = CpuProduct(m, x, rows, ldx, x_bf16);
            std::vector<float> want(rows * n);
            for (int r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < n; ++j) {
                float v = prod[r * wrows + j];
                if (silu) v = v / (1.0f + std::exp(-v)) * prod[r * wrows + n + j];
                want[r * n + j] = y_bf16 ? Bf16ToFloat(FloatToBf16(v)) : v;
              }
            }
            DeviceArray<float> dx(x), dscales(DeviceScales(m)), y(rows * ldy);
            DeviceArray<uint16_t> dx16(ToBf16(x)), y16(rows * ldy);
            DeviceArray<uint8_t> dcodes(m.codes);
            y.Poison();
            y16.Poison();
            cuda::QuantGemvArgs a;
            a.x = x_bf16 ? static_cast<const void*>(dx16.get()) : dx.get();
            a.ldx = ldx;
            a.x_bf16 = x_bf16;
            a.rows = rows;
            a.quant = f.quant;
            a.codes = dcodes.get();
            a.scales = dscales.get();
            a.group_size = m.group_size;
            a.n = n;
            a.k = k;
            a.y = y_bf16 ? static_cast<void*>(y16.get()) : y.get();
            a.ldy = ldy;
            a.y_bf16 = y_bf16;
            a.silu_mul = silu;
            const int64_t chunk = f.quant == WeightQuant::kInt4 ? 32 : 16;
            EXPECT_EQ(cuda::QuantGemvVectorized(a), k % chunk == 0 && ldx % 8 == 0);
            TANDEM_CUDA_CHECK(cuda::QuantGemv(a, stream_));
            std::vector<float> got(rows * n);
            const std::vector<float> gf = y.Download();
            const std::vector<uint16_t> g16 = y16.Download();
            for (int r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < n; ++j) {
                got[r * n + j] = y_bf16 ? Bf16ToFloat(g16[r * ldy + j]) : gf[r * ldy + j];
              }
            }
            ExpectClose(got, want, y_bf16 ? 8e-3 : 2e-5,
                        f.Name() + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                            " rows=" + std::to_string(rows) + (x_bf16 ? " x bf16" : " x f32") +
                            (silu ? " silu" : "") + (y_bf16 ? " y bf16" : ""));
          }
        }
      }
    }
  }
  cuda::QuantGemvArgs bad;
  bad.rows = cuda::kGemvMaxRows + 1;
  bad.n = 1;
  EXPECT_EQ(cuda::QuantGemv(bad, stream_), cudaErrorInvalidValue);
  bad.rows = 1;
  bad.quant = WeightQuant::kNone;
  EXPECT_EQ(cuda::QuantGemv(bad, stream_), cudaErrorInvalidValue);
}

// DequantizeRows writes the loader's dequantized values bit for bit (int4; int8: the codes, fp8:
// the codes' values, the scale comes after the product), rounded to nearest-even bf16 for bf16
// output.
TEST_F(CudaQuantKernelsTest, DequantizeRowsIsTheLoadersValue) {
  const int64_t n = 11, k = 200, n0 = 3, nr = 7;
  for (const Format& f : kFormats) {
    const QuantizedMatrix m = MakeMatrix(f, n, k, 5);
    DeviceArray<uint8_t> dcodes(m.codes);
    DeviceArray<float> dscales(DeviceScales(m)), out(nr * k);
    DeviceArray<uint16_t> out16(nr * k);
    out.Poison();
    out16.Poison();
    TANDEM_CUDA_CHECK(cuda::DequantizeRows(f.quant, dcodes.get(), dscales.get(), m.group_size, k,
                                           n0, nr, out.get(), false, stream_));
    TANDEM_CUDA_CHECK(cuda::DequantizeRows(f.quant, dcodes.get(), dscales.get(), m.group_size, k,
                                           n0, nr, out16.get(), true, stream_));
    const std::vector<float> got = out.Download();
    const std::vector<uint16_t> got16 = out16.Download();
    const int64_t row_bytes = f.quant == WeightQuant::kInt4 ? Int4RowBytes(k) : k;
    const int64_t groups = f.quant == WeightQuant::kInt4 ? Int4Groups(k, f.group) : 1;
    std::vector<float> row(k);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t src = n0 + r;
      if (f.quant == WeightQuant::kInt8) {
        for (int64_t c = 0; c < k; ++c) {
          row[c] = static_cast<float>(static_cast<int8_t>(m.codes[src * k + c]));
        }
      } else if (f.quant == WeightQuant::kFp8) {
        for (int64_t c = 0; c < k; ++c) row[c] = Fp8E4M3Value(m.codes[src * k + c]);
      } else {
        DequantizeRow(f.quant, m.codes.data() + src * row_bytes, m.scales.data() + src * groups,
                      m.zeros.data() + src * groups, k, f.group, row.data());
      }
      for (int64_t c = 0; c < k; ++c) {
        ASSERT_EQ(got[r * k + c], row[c]) << f.Name() << " row " << src << " col " << c;
        ASSERT_EQ(got16[r * k + c], FloatToBf16(row[c])) << f.Name() << " row " << src;
      }
    }
  }
}

// The products over quantized weights through Gemm: the GEMV up to kGemvMaxRows rows, above it
// the dequantized tiles and cuBLAS (a scratch of 5 rows, so several tiles), in both activation
// dtypes, against the CPU MatMul; and the SiLU product both ways.
TEST_F(CudaQuantKernelsTest, GemmOverQuantizedWeightsMatchesCpu) {
  const int64_t n = 26, k = 256, ldx = k + 8, ldy = n + 5;
  for (const Format& f : kFormats) {
    const QuantizedMatrix m = MakeMatrix(f, n, k, 17);
    DeviceArray<uint8_t> dcodes(m.codes);
    DeviceArray<float> dscales(DeviceScales(m));
    const int64_t scratch_bytes = 5 * k * 4;
    DeviceArray<uint8_t> dequant(scratch_bytes);
    for (bool x_bf16 : {false, true}) {
      for (int64_t rows : {1, 8, 9, 40}) {
        std::vector<float> x = RandomFloats(rows * ldx, rows * 3 + 1, -2, 2);
        const std::vector<float> want = CpuProduct(m, x, rows, ldx, x_bf16);
        DeviceArray<float> dx(x), y(rows * ldy), scratch(rows * n), out(rows * n / 2);
        DeviceArray<uint16_t> dx16(ToBf16(x));
        cuda::Gemm gemm;
        ASSERT_TRUE(gemm.Init(stream_).ok());
        cuda::DeviceMatrix w{dcodes.get(), DType::kBF16, n, k};
        w.quant = f.quant;
        w.scales = dscales.get();
        w.group_size = m.group_size;
        w.dequant = dequant.get();
        w.dequant_bytes = scratch_bytes;
        const cuda::GemmInput in{x_bf16 ? static_cast<const void*>(dx16.get()) : dx.get(), x_bf16,
                                 ldx};
        y.Poison();
        const absl::Status st = gemm.Run(in, rows, w, y.get(), ldy);
        ASSERT_TRUE(st.ok()) << st;
        const bool gemv = rows <= cuda::kGemvMaxRows;
        EXPECT_EQ(gemm.gemv_calls(), gemv ? 1 : 0);
        // 26 rows in tiles of 5 (bf16: 10): one GEMM per tile.
        EXPECT_EQ(gemm.cublas_calls(), gemv ? 0 : (x_bf16 ? 3 : 6));
        const std::vector<float> gy = y.Download();
        std::vector<float> got;
        for (int64_t r = 0; r < rows; ++r) {
          got.insert(got.end(), gy.begin() + r * ldy, gy.begin() + r * ldy + n);
        }
        const std::string what =
            f.Name() + (x_bf16 ? " x bf16" : " x f32") + " rows=" + std::to_string(rows);
        ExpectClose(got, want, 2e-5, what);

        out.Poison();
        const absl::Status sst = gemm.RunSiluMul(in, rows, w, scratch.get(), out.get(), false);
        ASSERT_TRUE(sst.ok()) << sst;
        std::vector<float> silu(rows * (n / 2));
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < n / 2; ++j) {
            const float g = want[r * n + j], u = want[r * n + n / 2 + j];
            silu[r * (n / 2) + j] = g / (1.0f + std::exp(-g)) * u;
          }
        }
        ExpectClose(out.Download(), silu, 2e-5, what + " silu");
      }
    }
    // No scratch: a clear error, not a wrong product.
    cuda::Gemm gemm;
    ASSERT_TRUE(gemm.Init(stream_).ok());
    cuda::DeviceMatrix w{dcodes.get(), DType::kBF16, n, k};
    w.quant = f.quant;
    w.scales = dscales.get();
    w.group_size = m.group_size;
    DeviceArray<float> dx(RandomFloats(9 * k, 1)), y(9 * n);
    EXPECT_FALSE(gemm.Run({dx.get(), false, k}, 9, w, y.get(), n).ok());
  }
}

}  // namespace
}  // namespace tandem::gpu_testing
