#include "common/base/huge_page_arena.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

#include "common/base/log.h"

namespace tandem {

HugePageArena::HugePageArena(size_t chunk_bytes)
    : chunk_bytes_((chunk_bytes + kHugePage - 1) / kHugePage * kHugePage) {
  if (chunk_bytes_ == 0) chunk_bytes_ = kHugePage;
}

HugePageArena::~HugePageArena() {
  for (const Chunk& c : chunks_) std::free(c.base);
}

void* HugePageArena::Allocate(size_t bytes) {
  TANDEM_CHECK(bytes <= SIZE_MAX / 2) << "allocation of " << bytes << " bytes";
  // A zero-byte request takes one alignment unit, so that every pointer is unique.
  const size_t need = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  if (need > static_cast<size_t>(end_ - next_)) {
    const size_t size =
        need > chunk_bytes_ ? (need + kHugePage - 1) / kHugePage * kHugePage : chunk_bytes_;
    char* base = static_cast<char*>(std::aligned_alloc(kHugePage, size));
    TANDEM_CHECK(base != nullptr) << "out of memory: cannot reserve " << size << " bytes";
    ::madvise(base, size, MADV_HUGEPAGE);  // a hint: without THP, ordinary pages
    chunks_.push_back(Chunk{base, size});
    next_ = base;
    end_ = base + size;
  }
  char* p = next_;
  next_ += need;
  used_bytes_ += need;
  return p;
}

}  // namespace tandem
