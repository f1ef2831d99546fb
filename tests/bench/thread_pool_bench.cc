// The cost of one fork/join of the compute pool, in the shape a decode step gives it: the
// calling thread runs a little serial work (norms, RoPE, input quantization), then a job of
// 16 short units (a projection's column ranges) over the pool. Prints the median over rounds
// of the time per job beyond its ideal (serial + units / threads): what the pool costs.
//
//   build/bin/thread_pool_bench [threads=2] [unit_us=1] [serial_us=2] [rounds=9]
//
// Compare two builds (before / after a pool change) alternating, several runs each.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/base/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

void BusyFor(double us) {
  const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double, std::micro>(us));
  while (Clock::now() < end) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const double unit_us = argc > 2 ? std::atof(argv[2]) : 1.0;
  const double serial_us = argc > 3 ? std::atof(argv[3]) : 2.0;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 9;
  if (threads < 2 || unit_us < 0 || serial_us < 0 || rounds < 1) {
    std::fprintf(stderr, "usage: thread_pool_bench [threads>=2] [unit_us] [serial_us] [rounds]\n");
    return 2;
  }
  tandem::ThreadPool pool(threads);
  constexpr int kUnits = 16;  // of unit_us each (a projection's column units)
  const double ideal_us = serial_us + unit_us * kUnits / threads;
  constexpr int kJobs = 5000;
  std::vector<double> overhead;
  for (int r = 0; r < rounds; ++r) {
    const Clock::time_point t0 = Clock::now();
    for (int j = 0; j < kJobs; ++j) {
      BusyFor(serial_us);
      pool.ParallelFor(kUnits, [&](int64_t b, int64_t e) { BusyFor(unit_us * (e - b)); });
    }
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kJobs;
    overhead.push_back(us - ideal_us);
    std::fprintf(stderr, "round %d/%d: %.2f us per job\n", r + 1, rounds, us);
  }
  std::sort(overhead.begin(), overhead.end());
  std::printf(
      "threads %d, %d units of %.1f us after %.1f us serial: fork/join overhead %.2f us "
      "(median of %d rounds; min %.2f, max %.2f)\n",
      threads, kUnits, unit_us, serial_us, overhead[overhead.size() / 2], rounds, overhead.front(),
      overhead.back());
  return 0;
}
