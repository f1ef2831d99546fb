#pragma once

// Memory read bandwidth, measured with every thread of a pool: the memory roofline against which
// decode MatMul (weight streaming) is judged.

#include <cstddef>
#include <cstdint>

#include "common/base/thread_pool.h"

namespace tandem::cpu {

struct ReadBandwidth {
  double best_gbps = 0;    // fastest iteration
  double median_gbps = 0;  // median iteration
  double worst_gbps = 0;   // slowest iteration
};

// A buffer of `bytes` (much more than the last-level cache) allocated and first touched once,
// then read whole by every pool thread (one contiguous slice each; pool may be nullptr: the
// calling thread alone) at each PassGBps(): bandwidth samples cheap enough to take between
// the steps of a benchmark, so each step is judged against the bandwidth of its moment.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(size_t bytes, ThreadPool* pool);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  // One timed read of the whole buffer, in GB/s (1e9 bytes per second).
  double PassGBps();

 private:
  void Pass();

  size_t bytes_;
  ThreadPool* pool_;
  char* buf_;
  uint64_t sink_ = 0;
};

// Reads a buffer of `bytes` (use much more than the last-level cache, e.g. 1 GiB) `iterations`
// times; each pool thread reads one contiguous slice per iteration (pool may be nullptr: the
// calling thread alone). GB/s are 1e9 bytes per second. One untimed warm-up pass comes first.
ReadBandwidth MeasureReadBandwidth(size_t bytes, int iterations, ThreadPool* pool);

// The best (maximum) of the iterations, in GB/s: the attainable read bandwidth.
double MeasureReadBandwidthGBps(size_t bytes, int iterations, ThreadPool* pool);

}  // namespace tandem::cpu
