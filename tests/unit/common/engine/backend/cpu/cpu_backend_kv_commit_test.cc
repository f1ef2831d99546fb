// The KV pool is committed at creation (CpuBackendOptions::commit_kv): every page of it is
// resident before the first step, and left to first use when asked not to. The activation
// buffers are sized at creation for CpuBackendOptions::max_num_tokens.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::testing {
namespace {

// Fraction of the pages of [p, p + bytes) that are resident (mincore).
double ResidentFraction(const uint8_t* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  std::vector<unsigned char> vec((end - begin + page - 1) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / static_cast<double>(vec.size());
}

double PoolResidentFraction(bool commit) {
  auto model = Load("stories260k", DType::kF32);
  if (model == nullptr) return -1;
  CpuBackendOptions options;
  options.num_blocks = 4096;  // 16 MiB and up: far more than any allocation touches by itself
  options.kv_dtype = DType::kF32;
  options.commit_kv = commit;
  auto backend = CpuBackend::Create(model, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return -1;
  CpuBackend& b = **backend;
  const KvCacheSpec& spec = b.kv_spec();
  EXPECT_EQ(b.kv_commit_seconds() > 0, commit);
  // The pool is one mapping, [layer][block][region]: from the first region to the last one.
  const uint8_t* first = b.HostBlockRegion(0, 0);
  const uint8_t* last = b.HostBlockRegion(spec.num_layers - 1, spec.num_blocks - 1);
  const size_t bytes = static_cast<size_t>(last - first) + spec.bytes_per_block_layer();
  EXPECT_EQ(bytes, spec.bytes_per_block() * static_cast<size_t>(spec.num_blocks));
  return ResidentFraction(first, bytes);
}

TEST(CpuBackendKvCommitTest, CommittedPoolIsResidentBeforeTheFirstStep) {
  EXPECT_EQ(PoolResidentFraction(/*commit=*/true), 1.0);
}

TEST(CpuBackendKvCommitTest, UncommittedPoolComesOnFirstUse) {
  EXPECT_LT(PoolResidentFraction(/*commit=*/false), 0.5);
}

TEST(CpuBackendKvCommitTest, ActivationsSizedAtCreationAndGrownBeyond) {
  auto model = Load("stories260k", DType::kF32);
  if (model == nullptr) GTEST_SKIP() << "no stories260k";
  const ModelConfig& c = model->config();
  const size_t per_token = (3 * c.hidden_size + 2 * c.num_heads * c.head_dim +
                            2 * c.num_kv_heads * c.head_dim + 3 * c.intermediate_size) *
                               sizeof(float) +
                           sizeof(cpu::AttentionQuery);
  for (int64_t max_tokens : {int64_t{0}, int64_t{48}}) {
    CpuBackendOptions options;
    options.num_blocks = 64;
    options.kv_dtype = DType::kF32;
    options.max_num_tokens = max_tokens;
    auto backend = CpuBackend::Create(model, options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    CpuBackend& b = **backend;
    EXPECT_EQ(b.activation_bytes(), per_token * static_cast<size_t>(max_tokens));
    // A step longer than max_num_tokens still runs: the buffers grow to it.
    std::vector<int32_t> tokens(80, 5), blocks;
    for (int32_t i = 0; i < 5; ++i) blocks.push_back(i);
    ForwardBatch batch;
    batch.AddSequence(tokens, 0, blocks, b.kv_spec().block_size, true);
    std::vector<float> logits(b.vocab_size());
    ASSERT_TRUE(b.Forward(batch, logits.data()).ok());
    EXPECT_EQ(b.activation_bytes(), per_token * 80);
  }
}

}  // namespace
}  // namespace tandem::testing
