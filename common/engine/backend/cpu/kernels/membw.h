#pragma once

// Memory read bandwidth, measured with every thread of a pool: the memory roofline against which
// decode MatMul (weight streaming) is judged.

#include <cstddef>

#include "common/base/thread_pool.h"

namespace tandem::cpu {

struct ReadBandwidth {
  double best_gbps = 0;    // fastest iteration
  double median_gbps = 0;  // median iteration
  double worst_gbps = 0;   // slowest iteration
};

// Reads a buffer of `bytes` (use much more than the last-level cache, e.g. 1 GiB) `iterations`
// times; each pool thread reads one contiguous slice per iteration (pool may be nullptr: the
// calling thread alone). GB/s are 1e9 bytes per second. One untimed warm-up pass comes first.
ReadBandwidth MeasureReadBandwidth(size_t bytes, int iterations, ThreadPool* pool);

// The best (maximum) of the iterations, in GB/s: the attainable read bandwidth.
double MeasureReadBandwidthGBps(size_t bytes, int iterations, ThreadPool* pool);

}  // namespace tandem::cpu
