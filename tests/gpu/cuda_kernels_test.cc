// Every CUDA kernel and the cuBLAS wrapper against the CPU kernels (or a float64 reference) on
// random inputs. Outputs are poisoned (NaN) before each launch so an unwritten element fails.

#include <algorithm>
#include <numeric>
#include <random>

#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cuda/attention_plan.h"
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

TEST_F(CudaKernelsTest, EmbedMatchesCpu) {
  const int64_t vocab = 50, d = 72, m = 9;
  std::vector<int32_t> ids = {0, 49, 3, 3, 17, 1, 48, 25, 7};
  for (bool bf16 : {false, true}) {
    std::vector<float> table = RandomFloats(vocab * d, 1);
    std::vector<uint16_t> table16 = ToBf16(table);
    std::vector<float> want(m * d);
    const void* host = bf16 ? static_cast<const void*>(table16.data()) : table.data();
    cpu::Embed(ids.data(), m, host, bf16 ? DType::kBF16 : DType::kF32, d, want.data());
    DeviceArray<int32_t> dids(ids);
    DeviceArray<float> dtable(table);
    DeviceArray<uint16_t> dtable16(table16);
    DeviceArray<float> out(m * d);
    out.Poison();
    const void* dev = bf16 ? static_cast<const void*>(dtable16.get()) : dtable.get();
    TANDEM_CUDA_CHECK(cuda::Embed(dids.get(), m, dev, bf16, d, out.get(), stream_));
    ExpectClose(out.Download(), want, 0, bf16 ? "embed bf16" : "embed f32");
  }
}

TEST_F(CudaKernelsTest, RmsNormAndAddRmsNormMatchCpu) {
  for (int64_t d : {8, 64, 1000, 2048}) {
    const int64_t m = 5;
    std::vector<float> x = RandomFloats(m * d, d, -3, 3), delta = RandomFloats(m * d, d + 1);
    std::vector<float> w = RandomFloats(d, d + 2, 0.5, 1.5);
    std::vector<float> want(m * d), residual = x;
    cpu::RmsNorm(x.data(), w.data(), m, d, 1e-5f, want.data());
    DeviceArray<float> dx(x), dw(w), ddelta(delta), out(m * d);
    out.Poison();
    TANDEM_CUDA_CHECK(cuda::RmsNorm(dx.get(), dw.get(), m, d, 1e-5f, out.get(), stream_));
    ExpectClose(out.Download(), want, 1e-5, "rmsnorm d=" + std::to_string(d));

    cpu::AddRmsNorm(residual.data(), delta.data(), w.data(), m, d, 1e-5f, want.data());
    out.Poison();
    TANDEM_CUDA_CHECK(
        cuda::AddRmsNorm(dx.get(), ddelta.get(), dw.get(), m, d, 1e-5f, out.get(), stream_));
    ExpectClose(out.Download(), want, 1e-5, "add_rmsnorm d=" + std::to_string(d));
    ExpectClose(dx.Download(), residual, 1e-6, "add_rmsnorm residual d=" + std::to_string(d));
  }
}

TEST_F(CudaKernelsTest, RopeMatchesCpu) {
  ModelConfig config;
  config.head_dim = 64;
  config.rope_theta = 500000;
  config.rope_scaling.type = RopeScaling::Type::kLlama3;
  config.rope_scaling.factor = 32;
  config.max_position_embeddings = 4096;
  const int64_t heads = 5, hd = 64, m = 7, ld = heads * hd + 24;
  std::vector<float> table = RopeCosSinTable(config, 4096);
  std::vector<int32_t> pos = {0, 1, 2, 100, 4095, 77, 3000};
  std::vector<float> x = RandomFloats(m * ld, 3), want = x;
  cpu::ApplyRope(want.data(), m, ld, heads, hd, pos.data(), table.data());
  DeviceArray<float> dx(x), dtable(table);
  DeviceArray<int32_t> dpos(pos);
  TANDEM_CUDA_CHECK(cuda::Rope(dx.get(), m, ld, heads, hd, dpos.get(), dtable.get(), stream_));
  ExpectClose(dx.Download(), want, 1e-6, "rope");
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
  out.Poison();
  TANDEM_CUDA_CHECK(cuda::SiluMul(dgu.get(), ld, m, f, out.get(), stream_));
  ExpectClose(out.Download(), want, 1e-6, "silu_mul");
}

TEST_F(CudaKernelsTest, WriteKvMatchesCpuByteForByte) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t kvh = 3, hd = 40, bs = 16, blocks = 6, m = 20;
    const int64_t ld = 2 * kvh * hd + 4;
    const size_t elems = static_cast<size_t>(blocks * 2 * kvh * bs * hd);
    std::vector<uint8_t> host(elems * DTypeSize(dtype), 0);
    std::vector<float> kv = RandomFloats(m * ld, 5);
    std::vector<int64_t> slots(m);
    for (int64_t i = 0; i < m; ++i) slots[i] = i == 4 ? -1 : (i * 7 + 3) % (blocks * bs);
    cpu::PagedKvLayer layer{host.data(), dtype, bs, kvh, hd};
    cpu::WriteKv(kv.data(), ld, kv.data() + kvh * hd, ld, m, slots.data(), layer);

    DeviceArray<uint8_t> pool(host.size());
    cudaMemset(pool.get(), 0, host.size());
    DeviceArray<float> dkv(kv);
    DeviceArray<int64_t> dslots(slots);
    KvLayerView view{pool.get(), dtype == DType::kBF16, static_cast<int32_t>(bs),
                     static_cast<int32_t>(kvh), static_cast<int32_t>(hd)};
    TANDEM_CUDA_CHECK(
        cuda::WriteKv(dkv.get(), ld, dkv.get() + kvh * hd, ld, m, dslots.get(), view, stream_));
    EXPECT_TRUE(pool.Download() == host) << DTypeName(dtype);
  }
}

TEST_F(CudaKernelsTest, GatherSplitCombineAndBias) {
  const int64_t m = 4, k = 33, ld = 40;
  std::vector<float> x = RandomFloats(m * ld, 6, -100, 100);
  std::vector<int32_t> rows = {3, 0, 3};
  DeviceArray<float> dx(x), gathered(rows.size() * k);
  DeviceArray<int32_t> drows(rows);
  gathered.Poison();
  TANDEM_CUDA_CHECK(cuda::GatherRows(dx.get(), ld, drows.get(), 3, k, gathered.get(), stream_));
  std::vector<float> want(3 * k);
  for (int i = 0; i < 3; ++i) std::copy_n(x.begin() + rows[i] * ld, k, want.begin() + i * k);
  ExpectClose(gathered.Download(), want, 0, "gather");

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
  std::vector<float> y2 = RandomFloats(2 * m * n, 7), bias = RandomFloats(n, 8);
  DeviceArray<float> dy2(y2), dbias(bias), y(m * (n + 3));
  y.Poison();
  TANDEM_CUDA_CHECK(cuda::CombineSplit(dy2.get(), m, n, dbias.get(), y.get(), n + 3, stream_));
  std::vector<float> got = y.Download();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_FLOAT_EQ(got[i * (n + 3) + j], y2[i * n + j] + y2[(m + i) * n + j] + bias[j]);
    }
  }
  TANDEM_CUDA_CHECK(cuda::AddBias(y.get(), m, n, n + 3, dbias.get(), stream_));
  std::vector<float> again = y.Download();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j)
      EXPECT_FLOAT_EQ(again[i * (n + 3) + j], got[i * (n + 3) + j] + bias[j]);
  }
}

// y = x W^T + b against float64, for f32 weights and both bf16 modes, over row counts on both
// sides of the stacked-GEMM limit.
TEST_F(CudaKernelsTest, GemmMatchesFloat64Reference) {
  const int64_t k = 96, n = 80, ldx = k + 8, ldy = n + 5, stack_rows = 64;
  for (DType wt : {DType::kF32, DType::kBF16}) {
    for (cuda::Bf16Mode mode : {cuda::Bf16Mode::kSplit, cuda::Bf16Mode::kRound}) {
      if (wt == DType::kF32 && mode == cuda::Bf16Mode::kRound) continue;
      for (int64_t m : {1, 5, 64, 65, 130}) {
        if (kEmulated && m > 65) continue;
        std::vector<float> x = RandomFloats(m * ldx, m, -2, 2), w = RandomFloats(n * k, 9);
        std::vector<float> bias = RandomFloats(n, 10);
        std::vector<uint16_t> w16 = ToBf16(w);
        std::vector<float> want(m * ldy, 0.0f);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double acc = bias[j];
            for (int64_t l = 0; l < k; ++l) {
              const double wv = wt == DType::kBF16 ? Bf16ToFloat(w16[j * k + l]) : w[j * k + l];
              acc += static_cast<double>(x[i * ldx + l]) * wv;
            }
            want[i * ldy + j] = static_cast<float>(acc);
          }
        }
        DeviceArray<float> dx(x), dw(w), dbias(bias), y(m * ldy);
        DeviceArray<uint16_t> dw16(w16), split(2 * 130 * k);
        DeviceArray<float> stacked(2 * stack_rows * n);
        cuda::Gemm gemm;
        ASSERT_TRUE(gemm.Init(stream_, mode).ok());
        gemm.SetScratch(split.get(), 2 * 130 * k, stacked.get(), stack_rows, n);
        cuda::DeviceMatrix matrix{
            wt == DType::kBF16 ? static_cast<const void*>(dw16.get()) : dw.get(), wt, n, k};
        y.Poison();
        absl::Status st = gemm.Run(dx.get(), m, ldx, matrix, dbias.get(), y.get(), ldy);
        ASSERT_TRUE(st.ok()) << st;
        std::vector<float> got = y.Download();
        // Padding columns of y are never written: compare the [m, n] block only.
        std::vector<float> g, e;
        for (int64_t i = 0; i < m; ++i) {
          g.insert(g.end(), got.begin() + i * ldy, got.begin() + i * ldy + n);
          e.insert(e.end(), want.begin() + i * ldy, want.begin() + i * ldy + n);
        }
        const double tol =
            wt == DType::kF32 ? 1e-5 : (mode == cuda::Bf16Mode::kSplit ? 1e-4 : 1e-2);
        ExpectClose(g, e, tol,
                    std::string(DTypeName(wt)) +
                        (mode == cuda::Bf16Mode::kSplit ? " split" : " round") +
                        " m=" + std::to_string(m));
      }
    }
  }
}

struct AttentionCase {
  int heads, kv_heads, head_dim;
  DType dtype;
  int window;
  std::vector<std::pair<int, int>> seqs;  // (context length after the step, tokens in the step)
};

// Runs cpu::PagedAttention and cuda::PagedAttention (planned by PlanAttention, or by
// PlanDecodeGraph with `graph_batch` padded rows) on the same random pool and queries.
void CheckAttention(const AttentionCase& c, int partition, int graph_batch = 0) {
  const int bs = 16, hd = c.head_dim, group = c.heads / c.kv_heads;
  int total_blocks = 0;
  for (auto [ctx, n] : c.seqs) total_blocks += (ctx + bs - 1) / bs;
  const int blocks = total_blocks + 3;
  const size_t elems = static_cast<size_t>(blocks) * 2 * c.kv_heads * bs * hd;
  std::vector<float> values = RandomFloats(elems, 11, -2, 2);
  std::vector<uint8_t> pool(elems * DTypeSize(c.dtype));
  if (c.dtype == DType::kBF16) {
    std::vector<uint16_t> v16 = ToBf16(values);
    std::memcpy(pool.data(), v16.data(), pool.size());
  } else {
    std::memcpy(pool.data(), values.data(), pool.size());
  }
  std::vector<int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(12));

  ForwardBatch batch;
  std::vector<std::vector<int32_t>> tables;
  int next = 0;
  for (auto [ctx, n] : c.seqs) {
    std::vector<int32_t> table;
    for (int b = 0; b < (ctx + bs - 1) / bs; ++b) table.push_back(order[next++]);
    tables.push_back(table);
    batch.AddSequence(std::vector<int32_t>(n, 1), ctx - n, table, bs, false);
  }
  const int64_t t = batch.num_tokens();
  const int64_t ld = c.heads * hd + 8;
  std::vector<float> q = RandomFloats(t * ld, 13, -1, 1);
  std::vector<int32_t> context_lens(t);
  std::vector<cpu::AttentionQuery> queries(t);
  for (int64_t i = 0; i < t; ++i) {
    context_lens[i] = batch.positions[i] + 1;
    queries[i].row = i;
    queries[i].context_len = context_lens[i];
    queries[i].block_table = tables[batch.seq_of_token[i]].data();
  }
  std::vector<float> want(t * ld, 0.0f);
  ThreadPool threads(2);
  cpu::PagedKvLayer layer{pool.data(), c.dtype, bs, c.kv_heads, hd};
  cpu::PagedAttention(q.data(), ld, queries.data(), t, c.heads, layer, c.window, want.data(), ld,
                      &threads);

  cuda::AttentionPlanOptions options;
  options.group = group;
  options.max_tile_tokens = std::max(1, 64 / group);  // as the backend: within 96 KiB
  while (options.max_tile_tokens > 1 &&
         cuda::AttentionSharedBytes(options.max_tile_tokens * group, hd) > 96 * 1024) {
    --options.max_tile_tokens;
  }
  options.partition = partition;
  options.min_split_keys = 32;
  options.max_partial_slots = 64;
  cuda::AttentionPlan plan;
  int stride = 0;
  for (const auto& table : tables) stride = std::max<int>(stride, table.size());
  int rows = static_cast<int>(t);
  if (graph_batch > 0) {  // one token per sequence, padded rows with no context
    int bucket = 512;
    while (bucket < *std::max_element(context_lens.begin(), context_lens.end())) bucket *= 2;
    plan = cuda::PlanDecodeGraph(graph_batch, bucket, options);
    stride = bucket / bs;
    rows = graph_batch;
  } else {
    plan = cuda::PlanAttention(batch, context_lens, c.window, options);
  }
  std::vector<int32_t> flat(static_cast<size_t>(rows) * stride, 0);
  for (size_t s = 0; s < tables.size(); ++s)
    std::copy(tables[s].begin(), tables[s].end(), flat.begin() + s * stride);
  context_lens.resize(rows, 0);
  q.resize(rows * ld, 0.0f);

  DeviceArray<uint8_t> dpool(pool.size());
  cudaMemcpy(dpool.get(), pool.data(), pool.size(), cudaMemcpyHostToDevice);
  DeviceArray<float> dq(q), out(rows * ld);
  DeviceArray<int32_t> dtables(flat), dctx(context_lens);
  DeviceArray<cuda::AttentionItem> items(plan.items);
  DeviceArray<cuda::CombineItem> combines(plan.combines);
  DeviceArray<float> part_o(64 * cuda::kMaxAttentionSplits * c.heads * hd);
  DeviceArray<float> part_ml(64 * cuda::kMaxAttentionSplits * c.heads * 2);
  out.Poison();
  part_o.Poison();
  part_ml.Poison();
  TANDEM_CUDA_CHECK(cuda::ConfigureAttention(96 * 1024));
  ASSERT_LE(cuda::AttentionSharedBytes(plan.max_tile_rows, hd), 96u * 1024);
  cuda::AttentionArgs a;
  a.q = dq.get();
  a.ldq = ld;
  a.out = out.get();
  a.ldo = ld;
  a.num_heads = c.heads;
  a.kv = KvLayerView{dpool.get(), c.dtype == DType::kBF16, bs, c.kv_heads, hd};
  a.block_tables = dtables.get();
  a.table_stride = stride;
  a.context_lens = dctx.get();
  a.sliding_window = c.window;
  a.items = items.get();
  a.num_items = static_cast<int32_t>(plan.items.size());
  a.max_tile_rows = plan.max_tile_rows;
  a.combines = combines.get();
  a.num_combines = static_cast<int32_t>(plan.combines.size());
  a.partial_out = part_o.get();
  a.partial_ml = part_ml.get();
  TANDEM_CUDA_CHECK(cuda::PagedAttention(a, nullptr));
  std::vector<float> got = out.Download();

  std::vector<float> g, e;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < c.heads * hd; ++j) {
      g.push_back(got[i * ld + j]);
      e.push_back(i < t ? want[i * ld + j] : 0.0f);  // padded rows: zeros
    }
  }
  ExpectClose(g, e, c.dtype == DType::kBF16 ? 1e-4 : 1e-5,
              "attention " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + "x" +
                  std::to_string(hd) + " " + std::string(DTypeName(c.dtype)) + " window " +
                  std::to_string(c.window) + (graph_batch ? " graph" : "") + " splits " +
                  std::to_string(plan.combines.size()));
}

TEST_F(CudaKernelsTest, PagedAttentionPrefillAndDecodeMatchCpu) {
  const bool big = !kEmulated;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    // Prefill chunks (one from scratch, one continuing a cached prefix) next to decode tokens.
    CheckAttention({8, 4, 8, dtype, 0, {{70, 70}, {33, 1}, {100, 20}, {1, 1}}}, 512);
    CheckAttention({4, 1, 64, dtype, 0, {{45, 45}, {200, 1}, {17, 3}}}, 512);
    CheckAttention({2, 2, 128, dtype, 0, {{90, 90}, {150, 1}}}, 512);
    if (big) CheckAttention({32, 8, 64, dtype, 0, {{700, 300}, {2000, 1}, {513, 1}}}, 512);
  }
}

TEST_F(CudaKernelsTest, PagedAttentionSplitsOverKeysMatchCpu) {
  // Small partitions force flash-decoding splits (and their merge) at test sizes.
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    CheckAttention({8, 4, 8, dtype, 0, {{300, 1}, {97, 1}, {64, 1}, {250, 4}, {40, 40}}}, 32);
    CheckAttention({4, 2, 64, dtype, 0, {{257, 1}, {33, 1}}}, 64);
  }
}

TEST_F(CudaKernelsTest, PagedAttentionSlidingWindowMatchesCpu) {
  CheckAttention({4, 2, 16, DType::kF32, 40, {{100, 100}, {130, 1}, {20, 20}}}, 512);
  CheckAttention({4, 2, 16, DType::kBF16, 40, {{300, 1}, {100, 3}}}, 32);
}

TEST_F(CudaKernelsTest, PagedAttentionDecodeGraphPlanPadsWithZeros) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    CheckAttention({8, 4, 8, dtype, 0, {{300, 1}, {1, 1}, {130, 1}}}, 128, /*graph_batch=*/5);
    CheckAttention({4, 1, 32, dtype, 0, {{20, 1}, {9, 1}}}, 512, /*graph_batch=*/4);
  }
}

}  // namespace
}  // namespace tandem::gpu_testing
