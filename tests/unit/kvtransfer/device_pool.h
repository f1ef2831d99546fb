#pragma once

// A KV pool in the CPU emulator's device memory (one cudaMalloc, exportable over CUDA IPC), for
// the tests of the device transports.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cuda/emulation/fake_cuda.h"
#include "gtest/gtest.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::testing {

// A KV pool in emulated device memory (one cudaMalloc, exportable), regions at a regular
// stride with guard bytes after each.
class DevicePool : public KvRegionAccess {
 public:
  static constexpr size_t kGuard = 32;
  static constexpr uint8_t kGuardByte = 0xa5;

  // `guard`: bytes after each region (0: the regions of a layer are contiguous).
  DevicePool(const KvLayout& layout, int64_t num_blocks, size_t guard = kGuard)
      : layout_(layout), num_blocks_(num_blocks), region_(layout.region_bytes()), guard_(guard) {
    bytes_ = std::max<size_t>(layout.num_layers * num_blocks * (region_ + guard_),
                              cuda_emu::kIpcMinBytes);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes_), cudaSuccess);
    base_ = static_cast<uint8_t*>(p);
    std::memset(base_, kGuardByte, bytes_);
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (int32_t b = 0; b < num_blocks_; ++b) std::memset(Region(l, b), 0, region_);
    }
  }
  ~DevicePool() override { cudaFree(base_); }
  uint8_t* Region(int64_t layer, int32_t block) override {
    return base_ + (layer * num_blocks_ + block) * (region_ + guard_);
  }
  int64_t num_blocks() const override { return num_blocks_; }

  // The bytes FakePool::Fill(seed) would hold in (layer, block).
  void Fill(uint64_t seed) {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (int32_t b = 0; b < num_blocks_; ++b) FillRegion(seed, l, b, Region(l, b));
    }
  }
  void FillRegion(uint64_t seed, int64_t l, int32_t b, uint8_t* r) const {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(l * num_blocks_ + b);
    for (size_t i = 0; i < region_; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      r[i] = static_cast<uint8_t>(x);
    }
  }
  // dst_blocks hold what Fill(seed) put in src_blocks, every other region is zero (so are the
  // `outside_window` blocks of the `window_layers`), every guard byte intact.
  bool LandedExactly(uint64_t seed, const std::vector<int32_t>& src_blocks,
                     const std::vector<int32_t>& dst_blocks,
                     const std::vector<int64_t>& window_layers = {},
                     const std::vector<int32_t>& outside_window = {}) {
    std::vector<uint8_t> want(region_), zero(region_, 0);
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      const bool windowed =
          std::find(window_layers.begin(), window_layers.end(), l) != window_layers.end();
      for (int32_t b = 0; b < num_blocks_; ++b) {
        const uint8_t* expected = zero.data();
        const bool skipped = windowed && std::find(outside_window.begin(), outside_window.end(),
                                                   b) != outside_window.end();
        for (size_t i = 0; i < dst_blocks.size() && !skipped; ++i) {
          if (dst_blocks[i] == b) {
            FillRegion(seed, l, src_blocks[i], want.data());
            expected = want.data();
          }
        }
        if (std::memcmp(Region(l, b), expected, region_) != 0) return false;
        for (size_t g = 0; g < guard_; ++g) {
          if (Region(l, b)[region_ + g] != kGuardByte) return false;
        }
      }
    }
    return true;
  }

 private:
  const KvLayout layout_;
  const int64_t num_blocks_;
  const size_t region_;
  const size_t guard_;
  size_t bytes_ = 0;
  uint8_t* base_ = nullptr;
};

}  // namespace tandem::kvtransfer::testing
