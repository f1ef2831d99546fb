// BlockStaging (common/engine/backend/cuda/block_staging.h) on the CPU emulator with deferred
// streams (a stream's work runs only when the host waits for it), so a copy that the host read
// before it landed, or that was not ordered with the stream's other work, shows.

#include "common/engine/backend/cuda/block_staging.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/cuda/emulation/fake_cuda.h"
#include "gtest/gtest.h"

namespace tandem::cuda {
namespace {

constexpr int64_t kLayers = 3;
constexpr int32_t kBlocks = 4;
constexpr size_t kLayerBytes = 96;
constexpr size_t kBlockBytes = kLayers * kLayerBytes;

// A [layer][block] pool like the backend's, filled with a pattern naming (layer, block, byte).
class Pool {
 public:
  Pool() {
    cuda_emu::SetDeferredStreams(true);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&base_, kLayers * kBlocks * kLayerBytes), cudaSuccess);
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int32_t b = 0; b < kBlocks; ++b) {
        std::vector<uint8_t> v = Pattern(l, b, 0);
        cudaMemcpy(Region(l, b), v.data(), kLayerBytes, cudaMemcpyHostToDevice);
      }
    }
  }
  ~Pool() {
    cudaStreamSynchronize(stream_);
    cudaFree(base_);
    cudaStreamDestroy(stream_);
    cuda_emu::SetDeferredStreams(false);
  }
  static std::vector<uint8_t> Pattern(int64_t layer, int32_t block, int salt) {
    std::vector<uint8_t> v(kLayerBytes);
    for (size_t i = 0; i < kLayerBytes; ++i)
      v[i] = static_cast<uint8_t>(layer * 61 + block * 7 + i + salt);
    return v;
  }
  static std::vector<uint8_t> BlockPattern(int32_t block, int salt) {
    std::vector<uint8_t> out;
    for (int64_t l = 0; l < kLayers; ++l) {
      std::vector<uint8_t> v = Pattern(l, block, salt);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }
  uint8_t* Region(int64_t layer, int32_t block) const {
    return base_ + (layer * kBlocks + block) * kLayerBytes;
  }
  // What the device holds for `block` now (waits for the stream).
  std::vector<uint8_t> Read(int32_t block) {
    cudaStreamSynchronize(stream_);
    std::vector<uint8_t> out(kBlockBytes);
    for (int64_t l = 0; l < kLayers; ++l) {
      cudaMemcpy(out.data() + l * kLayerBytes, Region(l, block), kLayerBytes,
                 cudaMemcpyDeviceToHost);
    }
    return out;
  }
  BlockStaging Staging(size_t slots) {
    return BlockStaging(stream_, kLayers, kLayerBytes, slots * kBlockBytes,
                        [this](int64_t l, int32_t b) { return Region(l, b); });
  }
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  uint8_t* base_ = nullptr;
};

// A staged read has not landed until the stream ran it, and it carries the block as it was when
// it was enqueued: a later overwrite on the stream (the next forward pass reusing the block) does
// not reach it. Its bytes reach the destination when it is polled.
TEST(BlockStagingTest, ReadIsOrderedBeforeLaterWorkAndLandsAsync) {
  Pool pool;
  BlockStaging st = pool.Staging(2);
  std::vector<uint8_t> got(kBlockBytes, 0);
  const std::optional<uint64_t> t = st.StartRead(1, got.data());
  ASSERT_TRUE(t.has_value());
  absl::StatusOr<bool> landed = st.Poll(*t, /*wait=*/false);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_FALSE(*landed);  // nothing waited for the stream yet
  const std::vector<uint8_t> later = Pool::Pattern(0, 1, 99);
  cudaMemcpyAsync(pool.Region(0, 1), later.data(), kLayerBytes, cudaMemcpyHostToDevice,
                  pool.stream());
  landed = st.Poll(*t, /*wait=*/true);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_TRUE(*landed);
  EXPECT_EQ(got, Pool::BlockPattern(1, 0));
  EXPECT_EQ(st.slots_in_use(), 0);
  EXPECT_EQ(st.staged_copies(), 1);
  EXPECT_EQ(st.staged_host_bytes(), static_cast<int64_t>(kBlockBytes));
  EXPECT_FALSE(st.Poll(*t, false).ok());  // the ticket ended
  // The later write ran after the read (and before `later` goes away).
  std::vector<uint8_t> now = Pool::BlockPattern(1, 0);
  std::copy(later.begin(), later.end(), now.begin());
  EXPECT_EQ(pool.Read(1), now);
}

// Staged copies take slots until they are polled; with every slot busy one is refused (the
// caller drops it) and is possible again once one landed.
TEST(BlockStagingTest, AFullRingRefusesInsteadOfWaiting) {
  Pool pool;
  BlockStaging st = pool.Staging(2);
  std::vector<uint8_t> got_a(kBlockBytes), got_b(kBlockBytes), got_c(kBlockBytes);
  const auto a = st.StartRead(0, got_a.data());
  const auto b = st.StartRead(2, got_b.data());
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_FALSE(st.StartRead(3, got_c.data()).has_value());
  EXPECT_FALSE(st.StartWrite(3, Pool::BlockPattern(3, 5).data()).has_value());
  ASSERT_TRUE(*st.Poll(*b, /*wait=*/true));
  EXPECT_EQ(got_b, Pool::BlockPattern(2, 0));
  const auto c = st.StartRead(3, got_c.data());
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE(*st.Poll(*a, true));
  EXPECT_EQ(got_a, Pool::BlockPattern(0, 0));
  ASSERT_TRUE(*st.Poll(*c, true));
  EXPECT_EQ(got_c, Pool::BlockPattern(3, 0));
}

// A staged write takes its source at once (the caller may reuse it) and lands ahead of work
// enqueued after it; its slot is free again once polled after landing.
TEST(BlockStagingTest, WriteTakesTheSourceAtOnceAndLandsInOrder) {
  Pool pool;
  BlockStaging st = pool.Staging(1);
  std::vector<uint8_t> src = Pool::BlockPattern(2, 42);
  const std::vector<uint8_t> want = src;
  const auto w = st.StartWrite(2, src.data());
  ASSERT_TRUE(w.has_value());
  std::fill(src.begin(), src.end(), 0);
  EXPECT_EQ(st.slots_in_use(), 1);
  EXPECT_EQ(pool.Read(2), want);  // waits for the stream
  ASSERT_TRUE(*st.Poll(*w, false));
  std::vector<uint8_t> got(kBlockBytes);
  const auto t = st.StartRead(2, got.data());  // the landed write's slot is taken again
  ASSERT_TRUE(t.has_value());
  ASSERT_TRUE(*st.Poll(*t, true));
  EXPECT_EQ(got, want);
  EXPECT_EQ(pool.Read(1), Pool::BlockPattern(1, 0));  // its neighbours untouched
  EXPECT_EQ(pool.Read(3), Pool::BlockPattern(3, 0));
}

// Memory from AllocatePinned is page-locked (the emulator counts it) and copied by DMA directly:
// no staging slot (a full ring does not limit them), no host copy, no copy from pageable memory.
// A read writes the destination only when the stream runs it; a write reads its source then
// (the caller keeps it unchanged until landed). The memory is unpinned with its last reference.
TEST(BlockStagingTest, PinnedMemoryIsCopiedDirectly) {
  Pool pool;
  const int64_t pinned_before = cuda_emu::PinnedBytes();
  const int64_t pageable_before = cuda_emu::PageableAsyncCopies();
  {
    BlockStaging st = pool.Staging(1);
    absl::StatusOr<HostMemory> m = st.AllocatePinned(3 * kBlockBytes);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(m->pinned);
    EXPECT_EQ(cuda_emu::PinnedBytes() - pinned_before, static_cast<int64_t>(3 * kBlockBytes));
    uint8_t* host = m->data.get();
    EXPECT_TRUE(cuda_emu::IsPinned(host, 3 * kBlockBytes));
    std::fill(host, host + 3 * kBlockBytes, 0);
    const auto r0 = st.StartRead(0, host);
    const auto r1 = st.StartRead(1, host + kBlockBytes);
    ASSERT_TRUE(r0.has_value() && r1.has_value());
    const std::vector<uint8_t> src = Pool::BlockPattern(3, 42);
    std::copy(src.begin(), src.end(), host + 2 * kBlockBytes);
    const auto w = st.StartWrite(3, host + 2 * kBlockBytes);
    ASSERT_TRUE(w.has_value());
    EXPECT_EQ(st.copies_in_flight(), 3);
    EXPECT_EQ(st.slots_in_use(), 0);
    EXPECT_FALSE(*st.Poll(*r0, false));
    EXPECT_EQ(std::vector<uint8_t>(host, host + kBlockBytes), std::vector<uint8_t>(kBlockBytes));
    ASSERT_TRUE(*st.Poll(*w, true));  // runs the stream up to the write, reads included
    EXPECT_TRUE(*st.Poll(*r0, false));
    EXPECT_TRUE(*st.Poll(*r1, false));
    EXPECT_EQ(std::vector<uint8_t>(host, host + kBlockBytes), Pool::BlockPattern(0, 0));
    EXPECT_EQ(std::vector<uint8_t>(host + kBlockBytes, host + 2 * kBlockBytes),
              Pool::BlockPattern(1, 0));
    EXPECT_EQ(pool.Read(3), src);
    EXPECT_EQ(st.direct_copies(), 3);
    EXPECT_EQ(st.staged_copies(), 0);
    EXPECT_EQ(st.staged_host_bytes(), 0);
    EXPECT_EQ(cuda_emu::PageableAsyncCopies(), pageable_before);
  }
  EXPECT_EQ(cuda_emu::PinnedBytes(), pinned_before);
}

}  // namespace
}  // namespace tandem::cuda
