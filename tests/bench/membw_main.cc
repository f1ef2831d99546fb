// Prints the machine's memory read bandwidth (the roofline for decode MatMul).
//   membw [MiB=1024] [iterations=10] [threads=all cores]

#include <cstdio>
#include <cstdlib>

#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/membw.h"

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 10;
  const int threads = argc > 3 ? std::atoi(argv[3]) : tandem::DefaultComputeThreads();
  tandem::ThreadPool pool(threads);
  const tandem::cpu::ReadBandwidth bw =
      tandem::cpu::MeasureReadBandwidth(mib << 20, iterations, &pool);
  std::printf(
      "read bandwidth, %zu MiB buffer, %d threads, %d iterations: best %.2f GB/s, "
      "median %.2f GB/s, worst %.2f GB/s\n",
      mib, threads, iterations, bw.best_gbps, bw.median_gbps, bw.worst_gbps);
  return 0;
}
