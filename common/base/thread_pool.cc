#include "common/base/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

#include "common/base/cpu_features.h"

namespace tandem {
namespace {
constexpr int kSpinIterations = 20000;  // ~tens of microseconds before sleeping
// Spins of the joining thread before it starts yielding its core: on a machine busier than the
// pool (other processes runnable), a worker it waits for may be descheduled, and spinning would
// only burn the time slice that worker needs.
constexpr int kJoinSpinsBeforeYield = 2000;
}  // namespace

int DefaultComputeThreads() { return GetCpuFeatures().num_cores; }

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::WorkerLoop(int tid) {
  uint64_t seen = 0;
  while (true) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    int spins = 0;
    while (gen == seen && spins < kSpinIterations) {
      _mm_pause();
      ++spins;
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    (*job_)(tid, num_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::Run(const std::function<void(int, int)>& fn) {
  if (num_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    // Publishing under the mutex pairs with the sleepers' predicate check.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  fn(0, num_threads_);
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kJoinSpinsBeforeYield) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  ParallelForGrain(n, 1, fn);
}

void ThreadPool::ParallelForGrain(int64_t n, int64_t grain,
                                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t units = (n + grain - 1) / grain;
  if (num_threads_ == 1 || units == 1) {
    fn(0, n);
    return;
  }
  Run([&](int tid, int nt) {
    int64_t per = units / nt, extra = units % nt;
    int64_t begin_u = tid * per + std::min<int64_t>(tid, extra);
    int64_t end_u = begin_u + per + (tid < extra ? 1 : 0);
    int64_t begin = std::min(n, begin_u * grain), end = std::min(n, end_u * grain);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace tandem
