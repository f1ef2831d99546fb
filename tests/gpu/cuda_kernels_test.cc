// Every CUDA kernel and the cuBLAS wrapper against the CPU kernels (or a float64 reference) on
// random inputs. Outputs are poisoned (NaN) before each launch so an unwritten element fails.

#include <algorithm>
#include <numeric>
#include <random>

#include "common/base/kv_layout.h"
#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cuda/gemm.h"
#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/model/rope.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::gpu_testing {
namespace {

using cuda::KvLayerView;

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_REQUIRE_GPU(); }
  cudaStream_t stream_ = nullptr;
};

// Every bf16 value of `got` is `want` (f32) rounded to nearest even, or a neighbour of it: the
// f32 values behind the two sides may differ in their last bits and round the other way.
void ExpectBf16Near(const std::vector<uint16_t>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    // Sign-magnitude bits to a monotonic integer scale, so neighbours differ by one.
    auto order = [](uint16_t b) { return b & 0x8000 ? -static_cast<int32_t>(b & 0x7fff) : b; };
    const int32_t g = order(got[i]), w = order(FloatToBf16(want[i]));
    if (std::abs(g - w) > 1 || std::isnan(Bf16ToFloat(got[i]))) {
      ADD_FAILURE() << what << ": element " << i << " is " << Bf16ToFloat(got[i]) << ", want "
                    << want[i] << " in bf16";
      return;
    }
  }
}

TEST_F(CudaKernelsTest, EmbedRmsNormMatchesCpu) {
  const int64_t vocab = 50, d = 72, m = 9;
  std::vector<int32_t> ids = {0, 49, 3, 3, 17, 1, 48, 25, 7};
  std::vector<float> w = RandomFloats(d, 2, 0.5, 1.5);
  for (bool bf16 : {false, true}) {
    for (bool out_bf16 : {false, true}) {
      std::vector<float> table = RandomFloats(vocab * d, 1);
      std::vector<uint16_t> table16 = ToBf16(table);
      std::vector<float> want_x(m * d), want(m * d);
      const void* host = bf16 ? static_cast<const void*>(table16.data()) : table.data();
      cpu::Embed(ids.data(), m, host, bf16 ? DType::kBF16 : DType::kF32, d, want_x.data());
      cpu::RmsNorm(want_x.data(), w.data(), m, d, 1e-5f, want.data());
      DeviceArray<int32_t> dids(ids);
      DeviceArray<float> dtable(table), dw(w), x(m * d), out(m * d);
      DeviceArray<uint16_t> dtable16(table16), out16(m * d);
      x.Poison();
      out.Poison();
      out16.Poison();
      const void* dev = bf16 ? static_cast<const void*>(dtable16.get()) : dtable.get();
      void* dout = out_bf16 ? static_cast<void*>(out16.get()) : out.get();
      TANDEM_CUDA_CHECK(cuda::EmbedRmsNorm(dids.get(), m, dev, bf16, d, dw.get(), 1e-5f, x.get(),
                                           dout, out_bf16, stream_));
      const std::string what =
          std::string("embed ") + (bf16 ? "bf16" : "f32") + (out_bf16 ? " -> bf16" : " -> f32");
      ExpectClose(x.Download(), want_x, 0, what + " x");
      if (out_bf16) {
        ExpectBf16Near(out16.Download(), want, what);
      } else {
        ExpectClose(out.Download(), want, 1e-5, what);
      }
    }
  }
}

TEST_F(CudaKernelsTest, RmsNormAndAddRmsNormMatchCpu) {
  for (int64_t d : {8, 64, 1000, 2048}) {
    for (bool out_bf16 : {false, true}) {
      const int64_t m = 5;
      std::vector<float> x = RandomFloats(m * d, d, -3, 3), delta = RandomFloats(m * d, d + 1);
      std::vector<float> w = RandomFloats(d, d + 2, 0.5, 1.5);
      std::vector<float> want(m * d), residual = x;
      const std::string what = "d=" + std::to_string(d) + (out_bf16 ? " bf16" : " f32");
      cpu::RmsNorm(x.data(), w.data(), m, d, 1e-5f, want.data());
      DeviceArray<float> dx(x), dw(w), ddelta(delta), out(m * d);
      DeviceArray<uint16_t> out16(m * d);
      void* dout = out_bf16 ? static_cast<void*>(out16.get()) : out.get();
      out.Poison();
      out16.Poison();
      TANDEM_CUDA_CHECK(cuda::RmsNorm(dx.get(), dw.get(), m, d, 1e-5f, dout, out_bf16, stream_));
      if (out_bf16) {
        ExpectBf16Near(out16.Download(), want, "rmsnorm " + what);
      } else {
        ExpectClose(out.Download(), want, 1e-5, "rmsnorm " + what);
      }

      cpu::AddRmsNorm(residual.data(), delta.data(), w.data(), m, d, 1e-5f, want.data());
      out.Poison();
      out16.Poison();
      TANDEM_CUDA_CHECK(
          cuda::AddRmsNorm(dx.get(), ddelta.get(), dw.get(), m, d, 1e-5f, dout, out_bf16, stream_));
      if (out_bf16) {
        ExpectBf16Near(out16.Download(), want, "add_rmsnorm " + what);
      } else {
        ExpectClose(out.Download(), want, 1e-5, "add_rmsnorm " + what);
      }
      ExpectClose(dx.Download(), residual, 1e-6, "add_rmsnorm residual " + what);
    }
  }
}

// The final norm of the logit rows: gathered (rows repeat), summed and normalized without
// touching the residual.
TEST_F(CudaKernelsTest, GatherAddRmsNormMatchesCpu) {
  const int64_t m = 6, d = 96, ld = 104;
  std::vector<float> x = RandomFloats(m * ld, 31, -3, 3), delta = RandomFloats(m * ld, 32);
  std::vector<float> w = RandomFloats(d, 33, 0.5, 1.5);
  std::vector<int32_t> rows = {5, 0, 5, 2};
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> picked_x, picked_delta, want(n * d);
  for (int32_t r : rows) {
    picked_x.insert(picked_x.end(), x.begin() + r * ld, x.begin() + r * ld + d);
    picked_delta.insert(picked_delta.end(), delta.begin() + r * ld, delta.begin() + r * ld + d);
  }
  cpu::AddRmsNorm(picked_x.data(), picked_delta.data(), w.data(), n, d, 1e-5f, want.data());
  for (bool out_bf16 : {false, true}) {
    DeviceArray<float> dx(x), ddelta(delta), dw(w), out(n * d);
    DeviceArray<uint16_t> out16(n * d);
    DeviceArray<int32_t> drows(rows);
    out.Poison();
    out16.Poison();
    void* dout = out_bf16 ? static_cast<void*>(out16.get()) : out.get();
    TANDEM_CUDA_CHECK(cuda::GatherAddRmsNorm(dx.get(), ddelta.get(), ld, drows.get(), n, d,
                                             dw.get(), 1e-5f, dout, out_bf16, stream_));
    if (out_bf16) {
      ExpectBf16Near(out16.Download(), want, "gather add rmsnorm bf16");
    } else {
      ExpectClose(out.Download(), want, 1e-5, "gather add rmsnorm");
    }
    ExpectClose(dx.Download(), x, 0, "residual untouched");
  }
}

// Bias, rotation of q and k and the KV write in one kernel against the CPU's ApplyRope and
// WriteKv over the biased projections: q in place, the pool element for element (bf16: up to one
// step, the rotated k's last bits may differ), a token without a slot writes nothing.
// A quantized pool written by the device (`got`) against the CPU's (`want`, laid out as `layer`
// says): the scales within float rounding of each other and every code the CPU's or its
// neighbour (the rotated values behind them may differ in their last bits, which moves a row's
// max and a value near a rounding boundary); the rows of `exact_slots` (the same inputs on both
// sides) equal byte for byte.
void ExpectQuantizedKvNear(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                           const cpu::PagedKvLayer& layer, const std::vector<int64_t>& exact_slots,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const int64_t hd = layer.head_dim, bs = layer.block_size, rows = 2 * layer.num_kv_heads * bs;
  const size_t region = KvRegionBytes(layer.num_kv_heads, bs, hd, layer.dtype);
  // Sign-magnitude codes (fp8) or two's complement (int8) on a monotonic integer scale.
  auto order = [&](uint8_t c) {
    if (layer.dtype == DType::kI8) return static_cast<int32_t>(static_cast<int8_t>(c));
    return (c & 0x80) != 0 ? -static_cast<int32_t>(c & 0x7f) : static_cast<int32_t>(c);
  };
  int64_t neighbours = 0;
  for (size_t b = 0; b < got.size() / region; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t slot = static_cast<int64_t>(b) * bs + r % bs;
      const bool exact =
          std::find(exact_slots.begin(), exact_slots.end(), slot) != exact_slots.end();
      const uint8_t* g = got.data() + b * region + r * hd;
      const uint8_t* w = want.data() + b * region + r * hd;
      float gs, ws;
      std::memcpy(&gs, got.data() + b * region + rows * hd + r * 4, 4);
      std::memcpy(&ws, want.data() + b * region + rows * hd + r * 4, 4);
      const std::string where = what + ": block " + std::to_string(b) + " row " + std::to_string(r);
      if (exact) {
        ASSERT_EQ(std::memcmp(g, w, hd), 0) << where;
        ASSERT_EQ(gs, ws) << where;
        continue;
      }
      ASSERT_NEAR(gs, ws, 1e-6 * std::fabs(ws)) << where;
      for (int64_t d = 0; d < hd; ++d) {
        const int32_t diff = std::abs(order(g[d]) - order(w[d]));
        ASSERT_LE(diff, 1) << where << " element " << d;
        neighbours += diff;
      }
    }
  }
  // Neighbours are the rare boundary cases, not a systematic difference.
  EXPECT_LE(neighbours, static_cast<int64_t>(got.size() / 100)) << what;
}

// With `remote`, the tokens of blocks 1 and 4 are written through slots of ids tagged
// kKvRemoteBlock (zero-copy KV transfer) into a second pool, at other indices
// (blocks - 1 - b): the two pools together must hold what the CPU wrote into one, and nothing
// else is written in either.
TEST_F(CudaKernelsTest, RopeWriteKvMatchesCpu) {
  ModelConfig config;
  config.head_dim = 64;
  config.rope_theta = 500000;
  config.rope_scaling.type = RopeScaling::Type::kLlama3;
  config.rope_scaling.factor = 32;
  config.max_position_embeddings = 4096;
  const std::vector<float> table = RopeCosSinTable(config, 4096);
  const int64_t heads = 6, kvh = 2, hd = 64, bs = 16, blocks = 5, m = 8;
  const int64_t qd = heads * hd, kvd = kvh * hd, ld = qd + 2 * kvd + 24;
  // Tokens at position 0 are not rotated, so both sides store the very same k and v there (the
  // last one's are zeros without the bias).
  const std::vector<int32_t> pos = {0, 1, 2, 100, 4095, 77, 3000, 0};
  std::vector<int64_t> slots = {3, 17, -1, 40, 79, 0, 64, 50};
  auto moved = [](int64_t b) { return b == 1 || b == 4; };
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool with_bias = variant == 1, remote = variant == 2;
      std::vector<float> qkv = RandomFloats(m * ld, 3);
      std::fill(qkv.begin() + (m - 1) * ld + qd, qkv.begin() + (m - 1) * ld + qd + 2 * kvd, 0.0f);
      std::vector<float> want = qkv;
      std::vector<float> bias = RandomFloats(qd + 2 * kvd, 4);
      if (with_bias) {
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < qd + 2 * kvd; ++j) want[i * ld + j] += bias[j];
        }
      }
      cpu::ApplyRope(want.data(), m, ld, heads + kvh, hd, pos.data(), table.data());
      const size_t elems = static_cast<size_t>(blocks * 2 * kvh * bs * hd);
      std::vector<uint8_t> host(blocks * KvRegionBytes(kvh, bs, hd, dtype), 0);
      cpu::PagedKvLayer layer{host.data(), dtype, bs, kvh, hd};
      cpu::WriteKv(want.data() + qd, ld, want.data() + qd + kvd, ld, m, slots.data(), layer);

      DeviceArray<float> dqkv(qkv), dtable(table), dbias(bias);
      DeviceArray<int32_t> dpos(pos);
      std::vector<int64_t> device_slots = slots;
      for (int64_t& slot : device_slots) {
        if (remote && slot >= 0 && moved(slot / bs)) {
          slot = (cuda::kKvRemoteBlock + blocks - 1 - slot / bs) * bs + slot % bs;
        }
      }
      DeviceArray<int64_t> dslots(device_slots);
      DeviceArray<uint8_t> pool(host.size()), remote_pool(host.size());
      cudaMemset(pool.get(), 0, host.size());
      cudaMemset(remote_pool.get(), 0, host.size());
      KvLayerView view{pool.get(), dtype, static_cast<int32_t>(bs), static_cast<int32_t>(kvh),
                       static_cast<int32_t>(hd)};
      if (remote) view.remote_base = remote_pool.get();
      TANDEM_CUDA_CHECK(cuda::RopeWriteKv(dqkv.get(), ld, m, heads, dpos.get(), dtable.get(),
                                          with_bias ? dbias.get() : nullptr, dslots.get(), view,
                                          stream_));
      const std::string what = std::string(DTypeName(dtype)) +
                               (with_bias ? " with bias" : " without bias") +
                               (remote ? " remote blocks" : "");
      const std::vector<float> got = dqkv.Download();
      std::vector<float> q, want_q;
      for (int64_t i = 0; i < m; ++i) {
        q.insert(q.end(), got.begin() + i * ld, got.begin() + i * ld + qd);
        want_q.insert(want_q.end(), want.begin() + i * ld, want.begin() + i * ld + qd);
      }
      ExpectClose(q, want_q, 1e-6, "rope q " + what);
      std::vector<uint8_t> got_pool = pool.Download();
      const std::vector<uint8_t> got_remote = remote_pool.Download();
      const size_t region = host.size() / blocks;
      for (int64_t b = 0; b < blocks; ++b) {
        // Each block lies in one pool; its place in the other stays zero.
        uint8_t* local_block = got_pool.data() + b * region;
        const uint8_t* remote_block = got_remote.data() + (blocks - 1 - b) * region;
        const uint8_t* unused = remote && moved(b) ? local_block : remote_block;
        ASSERT_TRUE(std::all_of(unused, unused + region, [](uint8_t x) { return x == 0; }))
            << what << ": block " << b << " written in the wrong pool";
        if (remote && moved(b)) std::memcpy(local_block, remote_block, region);
      }
      if (KvDTypeIsQuantized(dtype)) {
        ExpectQuantizedKvNear(got_pool, host, {host.data(), dtype, bs, kvh, hd}, {3, 50},
                              "kv " + what);
      } else if (dtype == DType::kF32) {
        std::vector<float> g(elems), e(elems);
        std::memcpy(g.data(), got_pool.data(), got_pool.size());
        std::memcpy(e.data(), host.data(), host.size());
        ExpectClose(g, e, 1e-6, "kv " + what);
      } else {
        std::vector<uint16_t> g(elems), e16(elems);
        std::memcpy(g.data(), got_pool.data(), got_pool.size());
        std::memcpy(e16.data(), host.data(), host.size());
        std::vector<float> e(elems);
        for (size_t i = 0; i < elems; ++i) e[i] = Bf16ToFloat(e16[i]);
        ExpectBf16Near(g, e, "kv " + what);
      }
    }
  }
}

TEST_F(CudaKernelsTest, SiluMulMatchesCpu) {
  const int64_t m = 6, f = 300, ld = 2 * f + 8;
  std::vector<float> gate_up = RandomFloats(m * ld, 4, -6, 6);
  std::vector<float> gate(m * f), up(m * f), want(m * f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < f; ++j) {
      gate[i * f + j] = gate_up[i * ld + j];
      up[i * f + j] = gate_up[i * ld + f + j];
    }
  }
  cpu::SiluMul(gate.data(), up.data(), m, f, want.data());
  DeviceArray<float> dgu(gate_up), out(m * f);
  DeviceArray<uint16_t> out16(m * f);
  out.Poison();
  out16.Poison();
  TANDEM_CUDA_CHECK(cuda::SiluMul(dgu.get(), ld, m, f, out.get(), false, stream_));
  ExpectClose(out.Download(), want, 1e-6, "silu_mul");
  TANDEM_CUDA_CHECK(cuda::SiluMul(dgu.get(), ld, m, f, out16.get(), true, stream_));
  ExpectBf16Near(out16.Download(), want, "silu_mul bf16");
}

TEST_F(CudaKernelsTest, SplitAndCombine) {
  const int64_t m = 4, k = 33, ld = 40;
  std::vector<float> x = RandomFloats(m * ld, 6, -100, 100);
  DeviceArray<float> dx(x);
  DeviceArray<uint16_t> split(2 * m * k);
  split.Poison();
  TANDEM_CUDA_CHECK(cuda::SplitToBf16(dx.get(), m, k, ld, true, split.get(), stream_));
  std::vector<uint16_t> parts = split.Download();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const float hi = Bf16ToFloat(parts[i * k + j]), lo = Bf16ToFloat(parts[(m + i) * k + j]);
      EXPECT_EQ(parts[i * k + j], FloatToBf16(x[i * ld + j]));
      EXPECT_LE(std::fabs(hi + lo - x[i * ld + j]), std::fabs(x[i * ld + j]) * 1e-5);
    }
  }

  const int64_t n = 9;
  std::vector<float> y2 = RandomFloats(2 * m * n, 7);
  DeviceArray<float> dy2(y2), y(m * (n + 3));
  y.Poison();
  TANDEM_CUDA_CHECK(cuda::CombineSplit(dy2.get(), m, n, y.get(), n + 3, stream_));
  std::vector<float> got = y.Download();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_FLOAT_EQ(got[i * (n + 3) + j], y2[i * n + j] + y2[(m + i) * n + j]);
    }
  }
}

// y = x W^T against float64 for f32 weights (f32 x) and bf16 weights (f32 and bf16 x), over row
// counts on both sides of the GEMV limit and of the stacked-GEMM limit, and the SiLU product;
// f32 x over bf16 weights stays within the parity mode's 1e-4.
TEST_F(CudaKernelsTest, GemmMatchesFloat64Reference) {
  const int64_t k = 96, n = 80, ldx = k + 8, ldy = n + 5, stack_rows = 64;
  for (DType wt : {DType::kF32, DType::kBF16}) {
    for (bool x_bf16 : {false, true}) {
      if (wt == DType::kF32 && x_bf16) continue;
      for (int64_t m : {1, 5, 8, 9, 64, 65, 130}) {
        if (kEmulated && m > 65) continue;
        std::vector<float> x = RandomFloats(m * ldx, m, -2, 2), w = RandomFloats(n * k, 9);
        std::vector<uint16_t> w16 = ToBf16(w), x16 = ToBf16(x);
        std::vector<double> prod(m * n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double acc = 0;
            for (int64_t l = 0; l < k; ++l) {
              const double wv = wt == DType::kBF16 ? Bf16ToFloat(w16[j * k + l]) : w[j * k + l];
              const double xv = x_bf16 ? Bf16ToFloat(x16[i * ldx + l]) : x[i * ldx + l];
              acc += xv * wv;
            }
            prod[i * n + j] = acc;
          }
        }
        DeviceArray<float> dx(x), dw(w), y(m * ldy), scratch(m * n);
        DeviceArray<uint16_t> dw16(w16), dx16(x16), split(2 * 130 * k);
        DeviceArray<float> stacked(2 * stack_rows * n);
        cuda::Gemm gemm;
        ASSERT_TRUE(gemm.Init(stream_).ok());
        gemm.SetScratch(split.get(), 2 * 130 * k, stacked.get(), stack_rows, n);
        cuda::DeviceMatrix matrix{
            wt == DType::kBF16 ? static_cast<const void*>(dw16.get()) : dw.get(), wt, n, k};
        cuda::GemmInput in{x_bf16 ? static_cast<const void*>(dx16.get()) : dx.get(), x_bf16, ldx};
        y.Poison();
        absl::Status st = gemm.Run(in, m, matrix, y.get(), ldy);
        ASSERT_TRUE(st.ok()) << st;
        const bool gemv = wt == DType::kBF16 && m <= cuda::kGemvMaxRows;
        EXPECT_EQ(gemm.gemv_calls(), gemv ? 1 : 0);
        std::vector<float> got = y.Download();
        // Padding columns of y are never written: compare the [m, n] block only.
        std::vector<float> g, e;
        for (int64_t i = 0; i < m; ++i) {
          g.insert(g.end(), got.begin() + i * ldy, got.begin() + i * ldy + n);
          for (int64_t j = 0; j < n; ++j) e.push_back(static_cast<float>(prod[i * n + j]));
        }
        const std::string what = std::string(DTypeName(wt)) + (x_bf16 ? " x bf16" : " x f32") +
                                 " m=" + std::to_string(m);
        const double tol = wt == DType::kF32 ? 1e-5 : (x_bf16 ? 1e-5 : 1e-4);
        ExpectClose(g, e, tol, what);

        // The SiLU product over the same weights as [gate; up] (f = n / 2), f32 output.
        const int64_t f = n / 2;
        DeviceArray<float> out(m * f);
        out.Poison();
        st = gemm.RunSiluMul(in, m, matrix, scratch.get(), out.get(), false);
        ASSERT_TRUE(st.ok()) << st;
        std::vector<float> want(m * f);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < f; ++j) {
            const double gt = prod[i * n + j], up = prod[i * n + f + j];
            want[i * f + j] = static_cast<float>(gt / (1.0 + std::exp(-gt)) * up);
          }
        }
        ExpectClose(out.Download(), want, tol, what + " silu");
      }
    }
  }
}

// The GEMV against the CPU MatMul over the same bf16 weights (f32 inputs as they are, bf16 inputs
// as the CPU's bf16-input path rounds them), for every row count it takes, 128-bit and scalar
// shapes, row strides, a bias and the fused SiLU epilogue (f32 and bf16 outputs). Unwritten
// outputs stay NaN and fail.
TEST_F(CudaKernelsTest, GemvMatchesCpuMatMul) {
  struct Shape {
    int64_t n, k, ldx;
  };
  for (Shape sh :
       {Shape{37, 256, 264}, Shape{20, 2056, 2056}, Shape{9, 172, 180}, Shape{6, 8, 8}}) {
    for (bool x_bf16 : {false, true}) {
      for (bool silu : {false, true}) {
        for (bool y_bf16 : {false, true}) {
          for (int rows = 1; rows <= cuda::kGemvMaxRows; rows += (rows < 3 ? 1 : 5)) {
            const int64_t n = sh.n, k = sh.k, ldx = sh.ldx, wrows = silu ? 2 * n : n;
            const int64_t ldy = n + 3;
            std::vector<float> x = RandomFloats(rows * ldx, rows + k, -2, 2);
            std::vector<float> xin = x;  // what the CPU multiplies
            if (x_bf16) {
              for (float& v : xin) v = Bf16ToFloat(FloatToBf16(v));
            }
            std::vector<uint16_t> w16 = ToBf16(RandomFloats(wrows * k, n + k, -0.5, 0.5));
            std::vector<float> bias = RandomFloats(n, 3);
            std::vector<float> prod(rows * wrows);
            cpu::MatMul(xin.data(), rows, k, ldx, w16.data(), DType::kBF16, wrows,
                        silu ? nullptr : bias.data(), prod.data(), wrows, nullptr);
            std::vector<float> want(rows * n);
            for (int m = 0; m < rows; ++m) {
              for (int64_t j = 0; j < n; ++j) {
                float v = prod[m * wrows + j];
                if (silu) {
                  const float g = v, u = prod[m * wrows + n + j];
                  v = g / (1.0f + std::exp(-g)) * u;
                }
                want[m * n + j] = y_bf16 ? Bf16ToFloat(FloatToBf16(v)) : v;
              }
            }
            DeviceArray<float> dx(x);
            DeviceArray<uint16_t> dx16(ToBf16(x)), dw(w16);
            DeviceArray<float> dbias(bias), y(rows * ldy);
            DeviceArray<uint16_t> y16(rows * ldy);
            y.Poison();
            y16.Poison();
            cuda::GemvArgs a;
            a.x = x_bf16 ? static_cast<const void*>(dx16.get()) : dx.get();
            a.ldx = ldx;
            a.x_bf16 = x_bf16;
            a.rows = rows;
            a.w = dw.get();
            a.n = n;
            a.k = k;
            a.bias = silu ? nullptr : dbias.get();
            a.y = y_bf16 ? static_cast<void*>(y16.get()) : y.get();
            a.ldy = ldy;
            a.y_bf16 = y_bf16;
            a.silu_mul = silu;
            EXPECT_EQ(cuda::GemvVectorized(a), k % 8 == 0 && ldx % 8 == 0);
            TANDEM_CUDA_CHECK(cuda::Gemv(a, stream_));
            std::vector<float> got(rows * n);
            const std::vector<float> gf = y.Download();
            const std::vector<uint16_t> g16 = y16.Download();
            for (int m = 0; m < rows; ++m) {
              for (int64_t j = 0; j < n; ++j) {
                got[m * n + j] = y_bf16 ? Bf16ToFloat(g16[m * ldy + j]) : gf[m * ldy + j];
              }
            }
            // Sums in another order: ~1e-6 relative, one bf16 step where rounding flips.
            ExpectClose(got, want, y_bf16 ? 8e-3 : 2e-5,
                        "gemv n=" + std::to_string(n) + " k=" + std::to_string(k) +
                            " rows=" + std::to_string(rows) + (x_bf16 ? " x bf16" : " x f32") +
                            (silu ? " silu" : "") + (y_bf16 ? " y bf16" : ""));
          }
        }
      }
    }
  }
  cuda::GemvArgs too_many;
  too_many.rows = cuda::kGemvMaxRows + 1;
  too_many.n = 1;
  EXPECT_EQ(cuda::Gemv(too_many, stream_), cudaErrorInvalidValue);
}

// A row's result does not depend on the rows beside it: row 0 alone and among eight, bit for bit.
TEST_F(CudaKernelsTest, GemvIsBatchInvariant) {
  const int64_t n = 48, k = 512;
  std::vector<float> x = RandomFloats(cuda::kGemvMaxRows * k, 21, -3, 3);
  DeviceArray<float> dx(x), y1(n), y8(cuda::kGemvMaxRows * n);
  DeviceArray<uint16_t> dw(ToBf16(RandomFloats(n * k, 22)));
  cuda::GemvArgs a;
  a.x = dx.get();
  a.ldx = k;
  a.w = dw.get();
  a.n = n;
  a.k = k;
  a.ldy = n;
  a.rows = 1;
  a.y = y1.get();
  TANDEM_CUDA_CHECK(cuda::Gemv(a, stream_));
  a.rows = cuda::kGemvMaxRows;
  a.y = y8.get();
  TANDEM_CUDA_CHECK(cuda::Gemv(a, stream_));
  const std::vector<float> one = y1.Download(), eight = y8.Download();
  EXPECT_EQ(std::memcmp(one.data(), eight.data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace tandem::gpu_testing
