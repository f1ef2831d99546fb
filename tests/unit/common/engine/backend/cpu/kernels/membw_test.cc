// MeasureReadBandwidth and ReadBandwidthProbe: sanity checks that they run and report ordered,
// positive figures.

#include "common/engine/backend/cpu/kernels/membw.h"

#include <gtest/gtest.h>

#include "common/base/thread_pool.h"

namespace tandem::cpu {
namespace {

TEST(MembwTest, ReportsPositiveOrderedFigures) {
  ThreadPool pool(2);
  const ReadBandwidth bw = MeasureReadBandwidth(32u << 20, 3, &pool);
  EXPECT_GT(bw.worst_gbps, 0.0);
  EXPECT_LE(bw.worst_gbps, bw.median_gbps);
  EXPECT_LE(bw.median_gbps, bw.best_gbps);
  EXPECT_GT(MeasureReadBandwidthGBps(8u << 20, 1, nullptr), 0.0);
}

TEST(MembwTest, ProbePassesAreRepeatable) {
  ThreadPool pool(2);
  ReadBandwidthProbe probe(8u << 20, &pool);
  for (int i = 0; i < 3; ++i) EXPECT_GT(probe.PassGBps(), 0.0);
  ReadBandwidthProbe alone(3u << 20, nullptr);  // rounded down to whole 2 MiB
  EXPECT_GT(alone.PassGBps(), 0.0);
}

}  // namespace
}  // namespace tandem::cpu
