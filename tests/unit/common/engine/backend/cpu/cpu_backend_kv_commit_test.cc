// The KV pool is committed at creation (CpuBackendOptions::commit_kv): every page of it is
// resident before the first step, and left to first use when asked not to.

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

}  // namespace
}  // namespace tandem::testing
