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

// A read has not landed until the stream ran it, and it carries the block as it was when it was
// enqueued: a later overwrite on the stream (the next forward pass reusing the block) does not
// reach it.
TEST(BlockStagingTest, ReadIsOrderedBeforeLaterWorkAndLandsAsync) {
  Pool pool;
  BlockStaging st = pool.Staging(2);
  const std::optional<uint64_t> t = st.StartRead(1);
  ASSERT_TRUE(t.has_value());
  std::vector<uint8_t> got(kBlockBytes, 0);
  absl::StatusOr<bool> landed = st.PollRead(*t, got.data(), /*wait=*/false);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_FALSE(*landed);  // nothing waited for the stream yet
  const std::vector<uint8_t> later = Pool::Pattern(0, 1, 99);
  cudaMemcpyAsync(pool.Region(0, 1), later.data(), kLayerBytes, cudaMemcpyHostToDevice,
                  pool.stream());
  landed = st.PollRead(*t, got.data(), /*wait=*/true);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_TRUE(*landed);
  EXPECT_EQ(got, Pool::BlockPattern(1, 0));
  EXPECT_EQ(st.slots_in_use(), 0);
  EXPECT_FALSE(st.PollRead(*t, got.data(), false).ok());  // the ticket ended
  // The later write ran after the read (and before `later` goes away).
  std::vector<uint8_t> now = Pool::BlockPattern(1, 0);
  std::copy(later.begin(), later.end(), now.begin());
  EXPECT_EQ(pool.Read(1), now);
}

// Reads take slots until they are polled; with every slot busy a read is refused (the caller
// drops it) and is possible again once one landed.
TEST(BlockStagingTest, AFullRingRefusesInsteadOfWaiting) {
  Pool pool;
  BlockStaging st = pool.Staging(2);
  const auto a = st.StartRead(0);
  const auto b = st.StartRead(2);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_FALSE(st.StartRead(3).has_value());
  EXPECT_FALSE(st.StartWrite(3, Pool::BlockPattern(3, 5).data()));
  std::vector<uint8_t> got(kBlockBytes);
  ASSERT_TRUE(*st.PollRead(*b, got.data(), /*wait=*/true));
  EXPECT_EQ(got, Pool::BlockPattern(2, 0));
  const auto c = st.StartRead(3);
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE(*st.PollRead(*a, got.data(), true));
  EXPECT_EQ(got, Pool::BlockPattern(0, 0));
  ASSERT_TRUE(*st.PollRead(*c, got.data(), true));
  EXPECT_EQ(got, Pool::BlockPattern(3, 0));
}

// A write takes its source at once (the caller may reuse it) and lands ahead of work enqueued
// after it; its slot is free again once it landed.
TEST(BlockStagingTest, WriteTakesTheSourceAtOnceAndLandsInOrder) {
  Pool pool;
  BlockStaging st = pool.Staging(1);
  std::vector<uint8_t> src = Pool::BlockPattern(2, 42);
  const std::vector<uint8_t> want = src;
  ASSERT_TRUE(st.StartWrite(2, src.data()));
  std::fill(src.begin(), src.end(), 0);
  EXPECT_EQ(st.slots_in_use(), 1);
  EXPECT_EQ(pool.Read(2), want);   // waits for the stream
  const auto t = st.StartRead(2);  // the landed write's slot is taken again
  ASSERT_TRUE(t.has_value());
  std::vector<uint8_t> got(kBlockBytes);
  ASSERT_TRUE(*st.PollRead(*t, got.data(), true));
  EXPECT_EQ(got, want);
  EXPECT_EQ(pool.Read(1), Pool::BlockPattern(1, 0));  // its neighbours untouched
  EXPECT_EQ(pool.Read(3), Pool::BlockPattern(3, 0));
}

}  // namespace
}  // namespace tandem::cuda
