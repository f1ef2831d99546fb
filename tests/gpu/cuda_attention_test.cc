// Paged attention on the CUDA backend (every path: the decode kernel, tensor-core tiles, SIMT
// tiles, the split merge) against cpu::PagedAttention on random pools and queries, for every KV
// dtype; and PlanAttention's choice of path. Outputs are poisoned (NaN) before each launch so an
// unwritten element fails.

#include <algorithm>
#include <numeric>
#include <random>

#include "common/base/kv_layout.h"
#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cuda/attention_plan.h"
#include "common/engine/backend/cuda/kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::gpu_testing {
namespace {

using cuda::KvLayerView;

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_REQUIRE_GPU(); }
  cudaStream_t stream_ = nullptr;
};

// Tiles on tensor cores (AttentionMmaSupported) round q, K, V and the softmax weights to bf16
// (relative error 2^-9 each; products exact, sums f32) where the CPU computes in f32: an output,
// a weighted mean of V rows, moves by a few such steps of the V values (|v| <= 2 here) in the
// worst case, about one where the errors average out. Measured in these tests: at most 4e-3 of
// max(1, max |output|); 2^-7 allows twice that, while a key dropped from a row's range or a
// misplaced fragment moves outputs by several times more (seen failing).
constexpr double kAttentionMmaTolerance = 1.0 / 128;

struct AttentionCase {
  int heads, kv_heads, head_dim;
  DType dtype;
  int window;
  std::vector<std::pair<int, int>> seqs;  // (context length after the step, tokens in the step)
};

// Runs cpu::PagedAttention and cuda::PagedAttention (planned by PlanAttention) on the same
// random pool and queries. With `grid` > 0 the kernels are launched as a captured graph launches
// them: `grid` blocks along the items and two along the merges, each looping over the step's
// (device-side) counts, and the queries padded with `grid` rows that no item covers.
// `out_bf16`: the output in bf16. `every_code` (quantized dtypes): every row's codes are the
// sweep ((row / block_size) * head_dim + d) % 256 under the scales the CPU wrote, so that with 4
// kv heads of 64 the V rows of each token hold all 256 codes between them; with context 1 the
// output is its V row, and must equal the CPU's bit for bit. `decode_span` > 0: the decode
// kernel stages that many block-table entries at a time (several spans per item).
// Whether PlanAttention sends tiles of more than kAttentionDecodeRows rows to tensor cores
// (AttentionPlanOptions::mma_tiles) in CheckAttention; else to the fp32 SIMT tile path.
bool g_attention_mma_tiles = true;
// Whether CheckAttention reads every other block of each table from a second pool (the tagged
// ids of zero-copy transfers, KvLayerView::remote_base): those blocks are moved there (at other
// indices) and their local copies poisoned, so a read of the wrong pool fails.
bool g_attention_remote_blocks = false;

void CheckAttention(const AttentionCase& c, int partition, int grid = 0, bool out_bf16 = false,
                    bool every_code = false, int decode_span = 0) {
  const int bs = 16, hd = c.head_dim, group = c.heads / c.kv_heads;
  int total_blocks = 0;
  for (auto [ctx, n] : c.seqs) total_blocks += (ctx + bs - 1) / bs;
  const int blocks = total_blocks + 3;
  const size_t elems = static_cast<size_t>(blocks) * 2 * c.kv_heads * bs * hd;
  std::vector<float> values = RandomFloats(elems, 11, -2, 2);
  std::vector<uint8_t> pool(blocks * KvRegionBytes(c.kv_heads, bs, hd, c.dtype));
  if (KvDTypeIsQuantized(c.dtype)) {  // every slot's k and v rows quantized by the CPU
    const int64_t slots_n = static_cast<int64_t>(blocks) * bs, kvd = c.kv_heads * hd;
    std::vector<int64_t> slots(slots_n);
    std::iota(slots.begin(), slots.end(), 0);
    cpu::WriteKv(values.data(), kvd, values.data() + slots_n * kvd, kvd, slots_n, slots.data(),
                 {pool.data(), c.dtype, bs, c.kv_heads, hd});
    const size_t region = KvRegionBytes(c.kv_heads, bs, hd, c.dtype);
    for (size_t b = 0; every_code && b < static_cast<size_t>(blocks); ++b) {
      for (int r = 0; r < 2 * c.kv_heads * bs; ++r) {
        for (int d = 0; d < hd; ++d) pool[b * region + r * hd + d] = ((r / bs) * hd + d) % 256;
      }
    }
  } else if (c.dtype == DType::kBF16) {
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
  options.mma_tiles = g_attention_mma_tiles;
  options.min_split_keys = 32;
  options.max_partial_slots = 64;
  int stride = 0;
  for (const auto& table : tables) stride = std::max<int>(stride, table.size());
  const cuda::AttentionPlan plan = cuda::PlanAttention(batch, context_lens, c.window, options);
  const int rows = static_cast<int>(t) + grid;
  std::vector<int32_t> flat(static_cast<size_t>(rows) * stride, 0);
  for (size_t s = 0; s < tables.size(); ++s)
    std::copy(tables[s].begin(), tables[s].end(), flat.begin() + s * stride);
  context_lens.resize(rows, 0);
  q.resize(rows * ld, 0.0f);

  std::vector<uint8_t> local = pool, remote(pool.size(), 0);
  if (g_attention_remote_blocks) {
    const size_t region = KvRegionBytes(c.kv_heads, bs, hd, c.dtype);
    for (size_t s = 0; s < tables.size(); ++s) {
      for (size_t i = 0; i < tables[s].size(); i += 2) {
        const int32_t b = tables[s][i], r = blocks - 1 - b;
        std::memcpy(remote.data() + r * region, pool.data() + b * region, region);
        std::memset(local.data() + b * region, 0x7f, region);
        flat[s * stride + i] = cuda::kKvRemoteBlock + r;
      }
    }
  }
  DeviceArray<uint8_t> dpool(pool.size()), dremote(pool.size());
  cudaMemcpy(dpool.get(), local.data(), pool.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dremote.get(), remote.data(), pool.size(), cudaMemcpyHostToDevice);
  DeviceArray<float> dq(q), out(rows * ld);
  DeviceArray<uint16_t> out16(rows * ld);
  DeviceArray<int32_t> dtables(flat), dctx(context_lens);
  DeviceArray<cuda::AttentionItem> items(plan.items);
  DeviceArray<cuda::CombineItem> combines(plan.combines);
  cuda::AttentionCounts host_counts;
  host_counts.num_items = static_cast<int32_t>(plan.items.size());
  host_counts.num_combines = static_cast<int32_t>(plan.combines.size());
  host_counts.table_stride = stride;
  DeviceArray<cuda::AttentionCounts> counts(std::vector<cuda::AttentionCounts>{host_counts});
  DeviceArray<float> part_o(64 * cuda::kMaxAttentionSplits * c.heads * hd);
  DeviceArray<float> part_ml(64 * cuda::kMaxAttentionSplits * c.heads * 2);
  out.Poison();
  out16.Poison();
  part_o.Poison();
  part_ml.Poison();
  TANDEM_CUDA_CHECK(cuda::ConfigureAttention(96 * 1024));
  const int max_rows = grid > 0 ? options.max_tile_tokens * group : plan.max_tile_rows;
  ASSERT_LE(cuda::AttentionSharedBytes(max_rows, hd), 96u * 1024);
  cuda::AttentionArgs a;
  a.q = dq.get();
  a.ldq = ld;
  a.out = out_bf16 ? static_cast<void*>(out16.get()) : out.get();
  a.ldo = ld;
  a.out_bf16 = out_bf16;
  a.num_heads = c.heads;
  a.kv = KvLayerView{dpool.get(), c.dtype, bs, c.kv_heads, hd};
  if (g_attention_remote_blocks) a.kv.remote_base = dremote.get();
  a.block_tables = dtables.get();
  a.context_lens = dctx.get();
  a.sliding_window = c.window;
  a.counts = counts.get();
  a.items = items.get();
  a.combines = combines.get();
  a.grid_items = grid > 0 ? grid : host_counts.num_items;
  a.grid_combines = grid > 0 ? 2 : host_counts.num_combines;
  a.max_tile_rows = max_rows;
  a.partial_out = part_o.get();
  a.partial_ml = part_ml.get();
  a.decode_table_span = decode_span;
  TANDEM_CUDA_CHECK(cuda::PagedAttention(a, nullptr));
  std::vector<float> got = out.Download();
  const std::vector<uint16_t> got16 = out16.Download();

  // Rows no item covers (the padding) are not written; bf16 output: the f32 result rounded.
  std::vector<float> g, e;
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < c.heads * hd; ++j) {
      g.push_back(out_bf16 ? Bf16ToFloat(got16[i * ld + j]) : got[i * ld + j]);
      e.push_back(want[i * ld + j]);
    }
  }
  // Both sides dequantize the same codes to the same f32 values; then only the order of the
  // f32 arithmetic differs.
  double tol = c.dtype == DType::kF32 ? 1e-5 : 1e-4;
  bool mma = false;
  for (const cuda::AttentionItem& item : plan.items) {
    mma = mma || (item.path == cuda::kAttentionPathMma && cuda::AttentionMmaSupported(a.kv));
  }
  if (mma) tol = kAttentionMmaTolerance;
  if (out_bf16) tol = std::max(tol, 1.0 / 128);  // one bf16 step of the largest value
  if (every_code) tol = 0;
  ExpectClose(g, e, tol,
              "attention " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + "x" +
                  std::to_string(hd) + " " + std::string(DTypeName(c.dtype)) + " window " +
                  std::to_string(c.window) + (grid ? " grid " + std::to_string(grid) : "") +
                  (out_bf16 ? " bf16 out" : "") + " splits " +
                  std::to_string(plan.combines.size()) +
                  (decode_span ? " span " + std::to_string(decode_span) : "") +
                  (g_attention_remote_blocks ? " remote blocks" : ""));
}

// PlanAttention's choice of path per item: the decode path up to decode_max_rows rows (tokens x
// group, at most kAttentionDecodeRows), tensor cores above with mma_tiles, else SIMT tiles; the
// splits of a tile keep its path.
TEST_F(CudaKernelsTest, AttentionPlanChoosesPaths) {
  ForwardBatch batch;
  const std::vector<int32_t> table(9, 0);  // positions up to 143: 100 + 40 tokens
  for (int n : {1, 2, 3, 40}) batch.AddSequence(std::vector<int32_t>(n, 1), 100, table, 16, false);
  std::vector<int32_t> lens;
  for (int64_t i = 0; i < batch.num_tokens(); ++i) lens.push_back(batch.positions[i] + 1);
  auto paths = [&](const cuda::AttentionPlanOptions& options) {
    std::vector<std::pair<int, int>> got;  // (tokens, path) per item
    for (const cuda::AttentionItem& it : cuda::PlanAttention(batch, lens, 0, options).items) {
      got.emplace_back(it.num_tokens, it.path);
    }
    return got;
  };
  cuda::AttentionPlanOptions options;
  options.group = 4;
  options.max_tile_tokens = 16;
  options.partition = 64;  // tiles of at most 8 tokens split over keys (2 or 3)
  options.min_split_keys = 32;
  options.max_partial_slots = 64;
  using P = std::vector<std::pair<int, int>>;
  const int d = cuda::kAttentionPathDecode, m = cuda::kAttentionPathMma;
  const int t = cuda::kAttentionPathTile;
  EXPECT_EQ(paths(options), (P{{1, d},
                               {1, d},
                               {2, d},
                               {2, d},
                               {3, m},
                               {3, m},
                               {16, m},
                               {16, m},
                               {8, m},
                               {8, m},
                               {8, m}}));
  options.mma_tiles = false;
  EXPECT_EQ(paths(options), (P{{1, d},
                               {1, d},
                               {2, d},
                               {2, d},
                               {3, t},
                               {3, t},
                               {16, t},
                               {16, t},
                               {8, t},
                               {8, t},
                               {8, t}}));
  options.decode_max_rows = 4;
  options.mma_tiles = true;
  EXPECT_EQ(paths(options), (P{{1, d},
                               {1, d},
                               {2, m},
                               {2, m},
                               {3, m},
                               {3, m},
                               {16, m},
                               {16, m},
                               {8, m},
                               {8, m},
                               {8, m}}));
}

// Tiles of more than kAttentionDecodeRows rows on tensor cores (bf16 mma.sync, f32 accumulation,
// online softmax): prefill from scratch and chunks over a cached prefix, head_dim 64 and 128,
// groups 1, 4 and 8, rows not a multiple of 16, causal and sliding-window masks, split tiles,
// graph-style grids and bf16 output, all four KV dtypes; kAttentionMmaTolerance.
TEST_F(CudaKernelsTest, PagedAttentionTensorCoreTilesMatchCpu) {
  for (int hd : {16, 64, 128}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
      std::vector<uint8_t> probe(64);
      ASSERT_TRUE(cuda::AttentionMmaSupported(KvLayerView{probe.data(), dtype, 16, 2, hd}));
    }
  }
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    CheckAttention({4, 4, 64, dtype, 0, {{150, 150}, {300, 45}, {20, 9}, {5, 1}}}, 512);
    CheckAttention({8, 2, 128, dtype, 0, {{200, 37}, {64, 64}, {90, 3}}}, 512);
    CheckAttention({16, 2, 64, dtype, 50, {{130, 130}, {260, 7}, {40, 2}}}, 64);
  }
  CheckAttention({8, 2, 64, DType::kBF16, 0, {{300, 8}, {100, 100}, {7, 1}}}, 64, /*grid=*/3);
  CheckAttention({8, 8, 128, DType::kF8E4M3, 30, {{120, 60}, {80, 9}}}, 32, /*grid=*/2, true);
}

// With AttentionPlanOptions::mma_tiles off, tiles run on the fp32 SIMT path (f32 tolerances).
TEST_F(CudaKernelsTest, PagedAttentionSimtTilesMatchCpu) {
  g_attention_mma_tiles = false;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    CheckAttention({4, 4, 64, dtype, 0, {{150, 150}, {300, 45}, {20, 9}, {5, 1}}}, 512);
    CheckAttention({16, 2, 64, dtype, 50, {{130, 130}, {260, 7}, {40, 2}}}, 64);
  }
  CheckAttention({8, 2, 64, DType::kBF16, 0, {{300, 8}, {100, 100}, {7, 1}}}, 64, /*grid=*/3);
  g_attention_mma_tiles = true;
}

// Decode items (at most kAttentionDecodeRows rows: tokens x group) run on the decode kernel
// (vector loads of K/V rows, warp-level scores and softmax): head_dim 64 and 128, groups 1, 4
// and 8, one token and a few (speculative verification), contexts up to a few thousand with and
// without splits, sliding windows, block tables staged in several spans, graph-style grids and
// bf16 output. Items of more rows next to them run as tiles. Its arithmetic is f32 as the CPU's,
// in another order: the tolerances of the tile kernel.
TEST_F(CudaKernelsTest, PagedAttentionDecodeKernelMatchesCpu) {
  for (int hd : {64, 128}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
      std::vector<uint8_t> probe(64);
      ASSERT_TRUE(cuda::AttentionDecodeVectorizable(KvLayerView{probe.data(), dtype, 16, 2, hd}));
    }
  }
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    // Group 1 (one and two rows), next to a prefill tile; no splits.
    CheckAttention({4, 4, 64, dtype, 0, {{1100, 1}, {37, 1}, {1, 1}, {129, 2}, {40, 20}}}, 4096);
    // Group 4 (4 and 8 rows), head_dim 128; splits of 256 keys.
    CheckAttention({8, 2, 128, dtype, 0, {{2100, 1}, {300, 2}, {17, 1}, {64, 1}}}, 256);
    // Group 8, splits, sliding window.
    CheckAttention({16, 2, 64, dtype, 100, {{900, 1}, {90, 1}, {260, 1}}}, 128);
  }
  // Block tables staged two and three entries at a time.
  CheckAttention({8, 2, 64, DType::kBF16, 0, {{300, 1}, {45, 2}}}, 4096, 0, false, false, 2);
  CheckAttention({8, 2, 64, DType::kF8E4M3, 50, {{300, 1}, {100, 2}}}, 64, 0, false, false, 3);
  // Graph-style grids and bf16 output.
  CheckAttention({8, 2, 128, DType::kBF16, 0, {{700, 1}, {5, 1}, {70, 20}}}, 128, /*grid=*/3);
  CheckAttention({8, 8, 64, DType::kI8, 0, {{400, 1}, {33, 2}}}, 64, /*grid=*/2, true);
  // head_dim 12 is not a multiple of 8: decode items fall back to the tile kernel.
  CheckAttention({4, 2, 12, DType::kBF16, 0, {{200, 1}, {30, 2}}}, 64);
}

TEST_F(CudaKernelsTest, PagedAttentionPrefillAndDecodeMatchCpu) {
  const bool big = !kEmulated;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    // Prefill chunks (one from scratch, one continuing a cached prefix) next to decode tokens.
    CheckAttention({8, 4, 8, dtype, 0, {{70, 70}, {33, 1}, {100, 20}, {1, 1}}}, 512);
    CheckAttention({4, 1, 64, dtype, 0, {{45, 45}, {200, 1}, {17, 3}}}, 512);
    CheckAttention({2, 2, 128, dtype, 0, {{90, 90}, {150, 1}}}, 512);
    if (big) CheckAttention({32, 8, 64, dtype, 0, {{700, 300}, {2000, 1}, {513, 1}}}, 512);
  }
}

// Every int8 and fp8 code (fp8 subnormals, zeros of both signs, the largest)
// dequantizes on the device to the CPU's value exactly (the two NaN codes of e4m3 read as 480 on
// both: the writers never produce them).
TEST_F(CudaKernelsTest, PagedAttentionDequantizesEveryCodeAsTheCpu) {
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    CheckAttention({4, 4, 64, dtype, 0, {{1, 1}, {1, 1}, {1, 1}}}, 512, 0, false, true);
  }
}

TEST_F(CudaKernelsTest, PagedAttentionSplitsOverKeysMatchCpu) {
  // Small partitions force flash-decoding splits (and their merge) at test sizes.
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    CheckAttention({8, 4, 8, dtype, 0, {{300, 1}, {97, 1}, {64, 1}, {250, 4}, {40, 40}}}, 32);
    CheckAttention({4, 2, 64, dtype, 0, {{257, 1}, {33, 1}}}, 64);
  }
}

TEST_F(CudaKernelsTest, PagedAttentionSlidingWindowMatchesCpu) {
  CheckAttention({4, 2, 16, DType::kF32, 40, {{100, 100}, {130, 1}, {20, 20}}}, 512);
  CheckAttention({4, 2, 16, DType::kBF16, 40, {{300, 1}, {100, 3}}}, 32);
  CheckAttention({4, 2, 16, DType::kF8E4M3, 40, {{300, 1}, {100, 3}}}, 32);
}

// As a captured graph runs it: a few blocks loop over the step's items and merges (counts read
// from device memory), padding rows after the step's tokens; and the bf16 output of the
// bf16-activation mode.
TEST_F(CudaKernelsTest, PagedAttentionPersistentGridAndBf16OutputMatchCpu) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    CheckAttention({8, 4, 8, dtype, 0, {{300, 1}, {1, 1}, {130, 1}, {70, 20}}}, 64, /*grid=*/3);
    CheckAttention({4, 1, 32, dtype, 0, {{20, 1}, {9, 1}}}, 512, /*grid=*/1);
    CheckAttention({8, 4, 8, dtype, 0, {{300, 1}, {97, 1}, {40, 40}}}, 32, 0, /*out_bf16=*/true);
    CheckAttention({8, 4, 8, dtype, 0, {{250, 4}, {64, 1}}}, 32, /*grid=*/2, /*out_bf16=*/true);
  }
}

// Block tables mixing the local pool's blocks and a second pool's (ids tagged kKvRemoteBlock,
// zero-copy KV transfer): every path (decode kernel, tensor-core and SIMT tiles, splits, graph
// grids) reads each block from the pool its id names, every KV dtype.
TEST_F(CudaKernelsTest, PagedAttentionReadsTaggedBlocksFromTheRemotePool) {
  g_attention_remote_blocks = true;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    CheckAttention({4, 4, 64, dtype, 0, {{150, 150}, {300, 45}, {20, 9}, {5, 1}}}, 512);
    CheckAttention({8, 2, 128, dtype, 0, {{700, 1}, {300, 2}, {17, 1}}}, 256);
  }
  CheckAttention({8, 2, 64, DType::kBF16, 0, {{300, 1}, {45, 2}}}, 4096, 0, false, false, 2);
  CheckAttention({8, 2, 64, DType::kBF16, 0, {{300, 8}, {100, 100}, {7, 1}}}, 64, /*grid=*/3);
  g_attention_mma_tiles = false;
  CheckAttention({16, 2, 64, DType::kF8E4M3, 50, {{130, 130}, {260, 7}, {40, 2}}}, 64);
  g_attention_mma_tiles = true;
  g_attention_remote_blocks = false;
}

}  // namespace
}  // namespace tandem::gpu_testing
