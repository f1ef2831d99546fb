#include "common/base/huge_page_arena.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(HugePageArenaTest, SpansAreAlignedDisjointAndWritable) {
  HugePageArena arena(HugePageArena::kHugePage);  // small chunks: many chunk changes
  struct Span {
    char* p;
    size_t n;
  };
  std::vector<Span> spans;
  const size_t sizes[] = {1, 63, 64, 65, 0, 4096, 1u << 20, 3u << 20, 7, 0, 2u << 20, 100};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
    char* p = static_cast<char*>(arena.Allocate(sizes[i]));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(Addr(p) % HugePageArena::kAlign, 0u) << "size " << sizes[i];
    std::memset(p, static_cast<int>(i + 1), sizes[i]);
    spans.push_back({p, sizes[i]});
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    for (size_t k = 0; k < spans[i].n; ++k) {
      ASSERT_EQ(spans[i].p[k], static_cast<char>(i + 1)) << "span " << i << " byte " << k;
    }
    for (size_t j = i + 1; j < spans.size(); ++j) {  // every pointer unique, spans disjoint
      const uintptr_t a = Addr(spans[i].p), b = Addr(spans[j].p);
      EXPECT_NE(a, b);
      EXPECT_TRUE(a + spans[i].n <= b || b + spans[j].n <= a) << i << " overlaps " << j;
    }
  }
}

TEST(HugePageArenaTest, ChunksStartOnHugePages) {
  HugePageArena arena(HugePageArena::kHugePage);
  // The first span of every chunk sits at its start: a request larger than a chunk gets its own.
  EXPECT_EQ(Addr(arena.Allocate(5u << 20)) % HugePageArena::kHugePage, 0u);
  EXPECT_EQ(Addr(arena.Allocate(HugePageArena::kHugePage)) % HugePageArena::kHugePage, 0u);
}

TEST(HugePageArenaTest, SpansFollowEachOtherInAChunk) {
  HugePageArena arena;
  char* a = static_cast<char*>(arena.Allocate(100));
  char* b = static_cast<char*>(arena.Allocate(10));
  EXPECT_EQ(b, a + 128);  // 100 rounded up to the alignment
  EXPECT_EQ(arena.used_bytes(), 128u + 64u);
}

TEST(HugePageArenaTest, CopyKeepsContents) {
  HugePageArena arena;
  const std::vector<float> f = {1.5f, -2.0f, 3.25f};
  const std::vector<uint8_t> u = {1, 2, 3, 4, 5};
  const float* fc = arena.Copy(f);
  const uint8_t* uc = arena.Copy(u);
  ASSERT_NE(fc, nullptr);
  ASSERT_NE(uc, nullptr);
  EXPECT_EQ(std::vector<float>(fc, fc + f.size()), f);
  EXPECT_EQ(std::vector<uint8_t>(uc, uc + u.size()), u);
  EXPECT_EQ(arena.Copy(std::vector<float>()), nullptr);
}

}  // namespace
}  // namespace tandem
