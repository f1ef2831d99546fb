// Paged KV cache (WriteKv / ReadKvSlot layout and bf16 rounding) and PagedAttention: accuracy
// against a double-precision reference and bit-exact invariance to batching and threads.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/base/half.h"
#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "tests/unit/common/engine/backend/cpu/kernels/kernel_test_util.h"

namespace tandem::cpu {
namespace {

using testing::PerSimdLevelTest;
using testing::RandomFloats;

struct CacheSpec {
  DType dtype;
  int64_t num_kv_heads, head_dim, block_size;
  std::vector<int64_t> seq_lens;
};

// A paged cache filled through WriteKv, with the values it should hold.
struct TestCache {
  PagedKvLayer kv;
  std::vector<uint8_t> storage;
  std::vector<std::vector<int32_t>> tables;    // per sequence
  std::vector<std::vector<float>> k, v;        // per sequence [len][kvh * hd], as stored
  std::vector<std::vector<float>> k_in, v_in;  // what was written (before bf16 rounding)

  int64_t Slot(size_t s, int64_t pos) const {
    return tables[s][pos / kv.block_size] * kv.block_size + pos % kv.block_size;
  }
};

TestCache MakeCache(const CacheSpec& spec, uint64_t seed) {
  TestCache c;
  c.kv.dtype = spec.dtype;
  c.kv.num_kv_heads = spec.num_kv_heads;
  c.kv.head_dim = spec.head_dim;
  c.kv.block_size = spec.block_size;
  int64_t blocks = 3;  // a few never used
  for (int64_t len : spec.seq_lens) blocks += (len + spec.block_size - 1) / spec.block_size;
  c.storage.assign(blocks * c.kv.block_stride_elems() * DTypeSize(spec.dtype), 0xee);
  c.kv.base = c.storage.data();
  std::vector<int32_t> ids(blocks);
  for (int64_t i = 0; i < blocks; ++i) ids[i] = static_cast<int32_t>(i);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t width = spec.num_kv_heads * spec.head_dim;
  size_t next = 0;
  for (size_t s = 0; s < spec.seq_lens.size(); ++s) {
    const int64_t len = spec.seq_lens[s];
    std::vector<int32_t> table;
    for (int64_t b = 0; b < (len + spec.block_size - 1) / spec.block_size; ++b) {
      table.push_back(ids[next++]);
    }
    c.tables.push_back(table);
    c.k_in.push_back(RandomFloats(len * width, seed + 2 * s + 1));
    c.v_in.push_back(RandomFloats(len * width, seed + 2 * s + 2));
    c.k.push_back(spec.dtype == DType::kBF16 ? testing::RoundTripBf16(c.k_in.back())
                                             : c.k_in.back());
    c.v.push_back(spec.dtype == DType::kBF16 ? testing::RoundTripBf16(c.v_in.back())
                                             : c.v_in.back());
  }
  // Write in chunks of up to 5 tokens with a skipped row (slot -1) in each chunk, rows strided.
  for (size_t s = 0; s < spec.seq_lens.size(); ++s) {
    const int64_t len = spec.seq_lens[s], ld = width + 3;
    for (int64_t p0 = 0; p0 < len; p0 += 5) {
      const int64_t n = std::min<int64_t>(5, len - p0);
      std::vector<float> kb((n + 1) * ld, 99.0f), vb((n + 1) * ld, 99.0f);
      std::vector<int64_t> slots(n + 1, -1);
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(&kb[(i + 1) * ld], &c.k_in[s][(p0 + i) * width], width * sizeof(float));
        std::memcpy(&vb[(i + 1) * ld], &c.v_in[s][(p0 + i) * width], width * sizeof(float));
        slots[i + 1] = c.Slot(s, p0 + i);
      }
      WriteKv(kb.data(), ld, vb.data(), ld, n + 1, slots.data(), c.kv);
    }
  }
  // Quantized caches: the values the kernels use are the dequantized ones (code * row scale).
  if (spec.dtype == DType::kI8 || spec.dtype == DType::kF8E4M3) {
    for (size_t s = 0; s < spec.seq_lens.size(); ++s) {
      for (int64_t p = 0; p < spec.seq_lens[s]; ++p) {
        ReadKvSlot(c.kv, c.Slot(s, p), 0, &c.k[s][p * width]);
        ReadKvSlot(c.kv, c.Slot(s, p), 1, &c.v[s][p * width]);
      }
    }
  }
  return c;
}

class AttentionTest : public PerSimdLevelTest {};

// The f32 value of an fp8 e4m3 code (OCP E4M3FN), straight from the definition.
double Fp8Value(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (c & 0x80) ? -v : v;
}

// Quantized KV rows: documented layout (codes, then one f32 scale per row after the block's
// codes), scale = max|row| / 127 (int8) or / 448 (fp8, stored times 256), codes within half a step,
// read-back = code * scale.
TEST_P(AttentionTest, QuantizedKvLayoutScalesAndRoundTrip) {
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    const int64_t kvh = 3, hd = 20, bs = 4, width = kvh * hd;
    const TestCache c = MakeCache({dtype, kvh, hd, bs, {9, 1, 4}}, 100);
    ASSERT_EQ(c.kv.block_stride_elems(), 2 * kvh * bs * hd + 2 * kvh * bs * 4);
    std::vector<float> out(width);
    for (size_t s = 0; s < c.tables.size(); ++s) {
      for (int64_t p = 0; p < static_cast<int64_t>(c.k_in[s].size() / width); ++p) {
        const int64_t slot = c.Slot(s, p), block = slot / bs, off = slot % bs;
        const uint8_t* blk = c.storage.data() + block * c.kv.block_stride_elems();
        for (int which = 0; which < 2; ++which) {
          const auto& input = which == 0 ? c.k_in[s] : c.v_in[s];
          ReadKvSlot(c.kv, slot, which, out.data());
          for (int64_t h = 0; h < kvh; ++h) {
            float amax = 0;
            for (int64_t d = 0; d < hd; ++d) {
              amax = std::max(amax, std::fabs(input[p * width + h * hd + d]));
            }
            float scale;
            std::memcpy(&scale, blk + 2 * kvh * bs * hd + ((which * kvh + h) * bs + off) * 4, 4);
            const uint8_t* codes = blk + ((which * kvh + h) * bs + off) * hd;
            for (int64_t d = 0; d < hd; ++d) {
              const float x = input[p * width + h * hd + d];
              if (dtype == DType::kI8) {
                ASSERT_EQ(scale, amax / 127.0f);
                const int8_t q = static_cast<int8_t>(codes[d]);
                ASSERT_EQ(q, static_cast<int8_t>(std::rint(x / scale)));
                ASSERT_EQ(out[h * hd + d], q * scale);
                ASSERT_LE(std::fabs(out[h * hd + d] - x), 0.5001f * scale);
              } else {
                ASSERT_EQ(scale, amax / 448.0f * 256.0f);
                const double v = Fp8Value(codes[d]) * (scale / 256.0);
                ASSERT_NEAR(out[h * hd + d], v, 1e-6 * std::fabs(v));
                // Half a unit in the last place of 3 mantissa bits (or of the subnormal step).
                ASSERT_LE(std::fabs(v - x), std::max(std::fabs(x) / 16.0, amax / 448.0 / 1024.0))
                    << "x=" << x << " code=" << int{codes[d]};
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(AttentionTest, WriteKvLayoutAndReadBack) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const TestCache c = MakeCache({dtype, 3, 20, 4, {9, 1, 4}}, 100);
    const int64_t hd = 20, bs = 4, width = 3 * hd;
    std::vector<float> out(width);
    for (size_t s = 0; s < c.tables.size(); ++s) {
      for (int64_t p = 0; p < static_cast<int64_t>(c.k[s].size() / width); ++p) {
        const int64_t slot = c.Slot(s, p), block = slot / bs, off = slot % bs;
        for (int which = 0; which < 2; ++which) {
          const auto& want = which == 0 ? c.k[s] : c.v[s];
          const auto& input = which == 0 ? c.k_in[s] : c.v_in[s];
          ReadKvSlot(c.kv, slot, which, out.data());
          ASSERT_EQ(0, std::memcmp(out.data(), &want[p * width], width * sizeof(float)));
          // Documented layout: block [2][num_kv_heads][block_size][head_dim].
          for (int64_t h = 0; h < 3; ++h) {
            for (int64_t d = 0; d < hd; ++d) {
              const int64_t e =
                  block * c.kv.block_stride_elems() + ((which * 3 + h) * bs + off) * hd + d;
              const float x = input[p * width + h * hd + d];
              if (dtype == DType::kBF16) {
                ASSERT_EQ(reinterpret_cast<const uint16_t*>(c.storage.data())[e], FloatToBf16(x));
              } else {
                ASSERT_EQ(reinterpret_cast<const float*>(c.storage.data())[e], x);
              }
            }
          }
        }
      }
    }
  }
}

struct QuerySpec {
  size_t seq;
  int64_t context_len;
};

// Reference attention in double for one query row.
void ReferenceAttention(const TestCache& c, const QuerySpec& qs, const float* q, int64_t num_heads,
                        int64_t window, std::vector<double>* out, double softcap = 0) {
  const int64_t hd = c.kv.head_dim, kvh = c.kv.num_kv_heads, group = num_heads / kvh;
  const int64_t width = kvh * hd, L = qs.context_len;
  const int64_t begin = (window > 0 && L > window) ? L - window : 0;
  out->assign(num_heads * hd, 0.0);
  for (int64_t h = 0; h < num_heads; ++h) {
    const int64_t g = h / group;
    std::vector<double> s;
    double mx = -1e300;
    for (int64_t j = begin; j < L; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < hd; ++d)
        dot += double{q[h * hd + d]} * c.k[qs.seq][j * width + g * hd + d];
      s.push_back(dot / std::sqrt(static_cast<double>(hd)));
      if (softcap > 0) s.back() = softcap * std::tanh(s.back() / softcap);
      mx = std::max(mx, s.back());
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int64_t j = begin; j < L; ++j) {
      for (int64_t d = 0; d < hd; ++d) {
        (*out)[h * hd + d] += s[j - begin] / sum * c.v[qs.seq][j * width + g * hd + d];
      }
    }
  }
}

struct AttnCase {
  DType dtype;
  int64_t num_heads, num_kv_heads, head_dim, block_size, window;
};

std::vector<AttnCase> Cases() {
  std::vector<AttnCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    cases.push_back({dtype, 8, 2, 64, 16, 0});    // GQA 4
    cases.push_back({dtype, 6, 2, 20, 5, 0});     // GQA 3, head_dim tail, odd block size
    cases.push_back({dtype, 4, 4, 136, 16, 37});  // MHA, sliding window, > 8 vectors + tail
    cases.push_back({dtype, 2, 1, 256, 8, 1});    // window of 1
    cases.push_back({dtype, 4, 2, 32, 16, 500});  // window longer than every context
    cases.push_back({dtype, 3, 3, 64, 16, 0});    // MHA: a prefill chunk's queries share rows
    cases.push_back({dtype, 4, 2, 20, 5, 0});     // GQA 2: two queries per tile, tail
  }
  return cases;
}

// Queries: several per sequence (as in a prefill chunk and decode steps), contexts 0..len.
std::vector<QuerySpec> MakeQueries(const std::vector<int64_t>& lens) {
  std::vector<QuerySpec> qs;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int64_t L : {int64_t{1}, lens[s] / 2, lens[s] - 1, lens[s]}) {
      if (L >= 0 && L <= lens[s]) qs.push_back({s, L});
    }
  }
  return qs;
}

// Each query's output computed alone (one query per call, no pool): [n][num_heads * head_dim].
std::vector<float> AloneOutputs(const TestCache& c, const AttnCase& ac,
                                const std::vector<QuerySpec>& qspecs, const float* q, int64_t ldq,
                                float softcap = 0) {
  const int64_t n = qspecs.size(), width = ac.num_heads * ac.head_dim;
  std::vector<float> alone(n * width);
  for (int64_t i = 0; i < n; ++i) {
    const AttentionQuery query{0, qspecs[i].context_len, c.tables[qspecs[i].seq].data()};
    PagedAttention(q + i * ldq, ldq, &query, 1, ac.num_heads, c.kv, ac.window,
                   alone.data() + i * width, width, nullptr, softcap);
  }
  return alone;
}

// Pools of 1, 2 and 3 threads.
std::vector<std::unique_ptr<ThreadPool>> SmallPools() {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  return pools;
}

TEST_P(AttentionTest, MatchesReference) {
  const std::vector<int64_t> lens = {1, 17, 100, 300};
  for (const AttnCase& ac : Cases()) {
    const TestCache c =
        MakeCache({ac.dtype, ac.num_kv_heads, ac.head_dim, ac.block_size, lens}, 7 + ac.head_dim);
    const auto qspecs = MakeQueries(lens);
    const int64_t width = ac.num_heads * ac.head_dim, ldq = width + 1, ldo = width + 2;
    const auto q = RandomFloats(qspecs.size() * ldq, 3, -2.0f, 2.0f);
    std::vector<AttentionQuery> queries;
    for (size_t i = 0; i < qspecs.size(); ++i) {
      queries.push_back(
          {static_cast<int64_t>(i), qspecs[i].context_len, c.tables[qspecs[i].seq].data()});
    }
    std::vector<float> out(qspecs.size() * ldo, 123.0f);
    ThreadPool pool(2);
    PagedAttention(q.data(), ldq, queries.data(), queries.size(), ac.num_heads, c.kv, ac.window,
                   out.data(), ldo, &pool);
    std::vector<double> want;
    for (size_t i = 0; i < qspecs.size(); ++i) {
      ReferenceAttention(c, qspecs[i], q.data() + i * ldq, ac.num_heads, ac.window, &want);
      for (int64_t e = 0; e < width; ++e) {
        ASSERT_NEAR(out[i * ldo + e], want[e], 2e-6)
            << DTypeName(ac.dtype) << " hd=" << ac.head_dim << " query " << i << " ctx "
            << qspecs[i].context_len << " elem " << e;
      }
      ASSERT_EQ(out[i * ldo + width], 123.0f) << "wrote padding";
    }
  }
}

TEST_P(AttentionTest, EmptyContextGivesZeros) {
  const TestCache c = MakeCache({DType::kF32, 1, 16, 16, {4}}, 1);
  const auto q = RandomFloats(32, 1);
  std::vector<float> out(32, 5.0f);
  const AttentionQuery query{0, 0, c.tables[0].data()};
  PagedAttention(q.data(), 32, &query, 1, 2, c.kv, 0, out.data(), 32, nullptr);
  for (float f : out) EXPECT_EQ(f, 0.0f);
}

// Each query's output is bit-identical alone, in any batch order, at any row, with 1-3 threads.
TEST_P(AttentionTest, BatchInvariant) {
  const std::vector<int64_t> lens = {3, 16, 70, 129};
  const std::vector<std::unique_ptr<ThreadPool>> pools = SmallPools();
  for (const AttnCase& ac : Cases()) {
    const TestCache c =
        MakeCache({ac.dtype, ac.num_kv_heads, ac.head_dim, ac.block_size, lens}, 50 + ac.head_dim);
    const auto qspecs = MakeQueries(lens);
    const int64_t n = qspecs.size(), width = ac.num_heads * ac.head_dim;
    const auto q = RandomFloats(n * width, 4);
    const std::vector<float> alone = AloneOutputs(c, ac, qspecs, q.data(), width);
    std::mt19937 rng(5);
    for (int trial = 0; trial < 3; ++trial) {
      // A random subset in random order, placed at random rows of a larger batch.
      std::vector<int64_t> order(n);
      for (int64_t i = 0; i < n; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      order.resize(n - trial * 3);
      const int64_t rows = order.size() + 2;
      std::vector<int64_t> row_of(order.size());
      for (size_t i = 0; i < order.size(); ++i) row_of[i] = (i * 7 + trial) % rows;
      std::vector<bool> used(rows, false);
      for (auto& r : row_of) {
        while (used[r]) r = (r + 1) % rows;
        used[r] = true;
      }
      std::vector<float> qb = RandomFloats(rows * width, 6 + trial);
      std::vector<AttentionQuery> queries;
      for (size_t i = 0; i < order.size(); ++i) {
        std::memcpy(&qb[row_of[i] * width], &q[order[i] * width], width * sizeof(float));
        queries.push_back(
            {row_of[i], qspecs[order[i]].context_len, c.tables[qspecs[order[i]].seq].data()});
      }
      for (auto& pool : pools) {
        std::vector<float> out(rows * width);
        PagedAttention(qb.data(), width, queries.data(), queries.size(), ac.num_heads, c.kv,
                       ac.window, out.data(), width, pool.get());
        for (size_t i = 0; i < order.size(); ++i) {
          ASSERT_EQ(0, std::memcmp(&out[row_of[i] * width], &alone[order[i] * width],
                                   width * sizeof(float)))
              << "query " << order[i] << " threads " << pool->size() << " hd " << ac.head_dim;
        }
      }
    }
  }
}

// Queries at consecutive positions of one sequence (a prefill chunk; PagedAttention runs them in
// tiles that share each K and V row) give each query's bits alone, among other queries, at any
// row and thread count.
TEST_P(AttentionTest, PrefillChunksMatchQueriesAlone) {
  const std::vector<int64_t> lens = {5, 16, 70, 129};
  const std::vector<std::unique_ptr<ThreadPool>> pools = SmallPools();
  for (const AttnCase& ac : Cases()) {
    const TestCache c =
        MakeCache({ac.dtype, ac.num_kv_heads, ac.head_dim, ac.block_size, lens}, 90 + ac.head_dim);
    // Every sequence's positions from 0, then a chunk from the middle, then one decode query.
    std::vector<QuerySpec> qspecs;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t L = 1; L <= lens[s]; ++L) qspecs.push_back({s, L});
      for (int64_t L = lens[s] / 2 + 1; L <= lens[s]; ++L) qspecs.push_back({s, L});
      qspecs.push_back({s, lens[s]});
    }
    const int64_t n = qspecs.size(), width = ac.num_heads * ac.head_dim, ldq = width + 5;
    const auto q = RandomFloats(n * ldq, 8);
    const std::vector<float> alone = AloneOutputs(c, ac, qspecs, q.data(), ldq);
    std::vector<AttentionQuery> queries;  // query i at row n - 1 - i
    for (int64_t i = 0; i < n; ++i) {
      queries.push_back({n - 1 - i, qspecs[i].context_len, c.tables[qspecs[i].seq].data()});
    }
    std::vector<float> qb(n * ldq);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&qb[(n - 1 - i) * ldq], &q[i * ldq], width * sizeof(float));
    }
    for (auto& pool : pools) {
      std::vector<float> out(n * width, 7.0f);
      PagedAttention(qb.data(), ldq, queries.data(), n, ac.num_heads, c.kv, ac.window, out.data(),
                     width, pool.get());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(0,
                  std::memcmp(&out[(n - 1 - i) * width], &alone[i * width], width * sizeof(float)))
            << DTypeName(ac.dtype) << " heads " << ac.num_heads << "/" << ac.num_kv_heads << " hd "
            << ac.head_dim << " window " << ac.window << " seq " << qspecs[i].seq << " ctx "
            << qspecs[i].context_len << " threads " << pool->size();
      }
    }
  }
}

// Soft-capped scores (Gemma 2): each scaled score s becomes cap * tanh(s / cap) before the
// softmax; the result matches the double reference (and differs from the uncapped one), and
// prefill-chunk tiles give each query the bits it gets alone.
TEST_P(AttentionTest, SoftCappedScoresMatchReferenceAndChunks) {
  const std::vector<int64_t> lens = {9, 40};
  const float cap = 1.5f;
  for (const AttnCase& ac :
       {AttnCase{DType::kF32, 4, 2, 32, 16, 0}, AttnCase{DType::kBF16, 4, 2, 20, 5, 12}}) {
    const TestCache c =
        MakeCache({ac.dtype, ac.num_kv_heads, ac.head_dim, ac.block_size, lens}, 40 + ac.head_dim);
    std::vector<QuerySpec> qspecs;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t L = 1; L <= lens[s]; ++L) qspecs.push_back({s, L});
    }
    const int64_t n = qspecs.size(), width = ac.num_heads * ac.head_dim;
    const auto q = RandomFloats(n * width, 12, -3.0f, 3.0f);
    const std::vector<float> alone = AloneOutputs(c, ac, qspecs, q.data(), width, cap);
    std::vector<AttentionQuery> queries;
    for (int64_t i = 0; i < n; ++i) {
      queries.push_back({i, qspecs[i].context_len, c.tables[qspecs[i].seq].data()});
    }
    std::vector<float> out(n * width);
    ThreadPool pool(2);
    PagedAttention(q.data(), width, queries.data(), n, ac.num_heads, c.kv, ac.window, out.data(),
                   width, &pool, cap);
    ASSERT_EQ(0, std::memcmp(out.data(), alone.data(), out.size() * sizeof(float)));
    double capped_vs_plain = 0;
    std::vector<double> want, plain;
    for (int64_t i = 0; i < n; ++i) {
      ReferenceAttention(c, qspecs[i], q.data() + i * width, ac.num_heads, ac.window, &want, cap);
      ReferenceAttention(c, qspecs[i], q.data() + i * width, ac.num_heads, ac.window, &plain);
      for (int64_t e = 0; e < width; ++e) {
        ASSERT_NEAR(out[i * width + e], want[e], 2e-6) << "query " << i << " elem " << e;
        capped_vs_plain = std::max(capped_vs_plain, std::abs(want[e] - plain[e]));
      }
    }
    EXPECT_GT(capped_vs_plain, 1e-2) << "the cap bites at these scores";
  }
}

TANDEM_INSTANTIATE_PER_SIMD_LEVEL(AttentionTest);

}  // namespace
}  // namespace tandem::cpu
