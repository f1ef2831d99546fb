#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

namespace tandem {

// Memory for large read-mostly data (model weights): chunks aligned to 2 MiB and advised for
// transparent huge pages (madvise MADV_HUGEPAGE), handed out in 64-byte-aligned spans, one after
// the other. A decode step streams every weight once; through 4 KiB pages that is a TLB miss
// every 4 KiB, through 2 MiB pages one per 2 MiB. The advice is a hint: where THP is off the
// memory is ordinary pages. Untouched chunk tails are never faulted in, so over-reserving costs
// address space only. Not thread-safe; memory lives until the arena is destroyed.
class HugePageArena {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kAlign = 64;
  static constexpr size_t kDefaultChunkBytes = size_t{256} << 20;

  explicit HugePageArena(size_t chunk_bytes = kDefaultChunkBytes);
  ~HugePageArena();
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;

  // `bytes` bytes aligned to kAlign (bytes == 0: a valid, unique pointer). A request larger than
  // the space left starts a new chunk (of its own size if larger than the chunk size). Aborts
  // when the system has no memory left.
  void* Allocate(size_t bytes);

  // A copy of `v` in the arena (nullptr when v is empty).
  template <class T>
  T* Copy(const std::vector<T>& v) {
    if (v.empty()) return nullptr;
    T* p = static_cast<T*>(Allocate(v.size() * sizeof(T)));
    std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }

  // Bytes handed out so far (including alignment padding).
  size_t used_bytes() const { return used_bytes_; }

 private:
  struct Chunk {
    char* base;
    size_t size;
  };
  size_t chunk_bytes_;
  std::vector<Chunk> chunks_;
  char* next_ = nullptr;  // free space of the current chunk: [next_, end_)
  char* end_ = nullptr;
  size_t used_bytes_ = 0;
};

}  // namespace tandem
