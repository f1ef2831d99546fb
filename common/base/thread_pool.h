#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

// A fixed team of compute threads for data-parallel kernels. The calling thread takes part as
// participant 0, so a pool of size N starts N-1 threads and never oversubscribes N cores.
// Workers spin briefly between jobs (decode steps issue many short jobs back to back), then sleep.
// Run() may be called from one thread at a time (the engine thread); it is not reentrant.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Calls fn(tid, size()) once on every participant and returns when all are done.
  void Run(const std::function<void(int tid, int nthreads)>& fn);

  // Splits [0, n) into size() contiguous ranges (some may be empty) and calls fn(begin, end) on
  // each. The split depends only on n and size(): results never depend on timing.
  void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

  // Like ParallelFor, but ranges are multiples of `grain` (except the last).
  void ParallelForGrain(int64_t n, int64_t grain,
                        const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void WorkerLoop(int tid);

  const int num_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

// Default pool size: the number of cores available to this process.
int DefaultComputeThreads();

}  // namespace tandem
