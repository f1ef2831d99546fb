#include "common/base/thread_pool.h"

#include <algorithm>

#include "common/base/cpu_features.h"

namespace tandem {
namespace {
constexpr int kSpinIterations = 20000;  // ~tens of microseconds before sleeping
// Spins of the joining thread before it starts yielding its core: a claim still running on a
// descheduled worker needs that core more than the spin does.
constexpr int kJoinSpinsBeforeYield = 2000;

uint32_t GenOf(uint64_t word) { return static_cast<uint32_t>(word >> 32); }
int BeginOf(uint64_t word) { return static_cast<int>((word >> 16) & 0xffff); }
int EndOf(uint64_t word) { return static_cast<int>(word & 0xffff); }
uint64_t ShareWord(uint32_t gen, int begin, int end) {
  return (static_cast<uint64_t>(gen) << 32) | (static_cast<uint64_t>(begin) << 16) |
         static_cast<uint64_t>(end);
}
}  // namespace

int DefaultComputeThreads() { return GetCpuFeatures().num_cores; }

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(std::max(1, num_threads)), shares_(static_cast<size_t>(num_threads_)) {
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    ++generation_;
    current_.store(generation_, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

bool ThreadPool::ClaimOwn(uint32_t gen, int self, int* begin, int* end) {
  std::atomic<uint64_t>& own = shares_[self].word;
  uint64_t w = own.load(std::memory_order_acquire);
  while (GenOf(w) == gen && BeginOf(w) < EndOf(w)) {
    const int b = BeginOf(w), left = EndOf(w) - b;
    const int take = (left + kClaimDivisor - 1) / kClaimDivisor;
    if (own.compare_exchange_weak(w, w + (static_cast<uint64_t>(take) << 16),
                                  std::memory_order_acq_rel, std::memory_order_acquire)) {
      *begin = b;
      *end = b + take;
      return true;
    }
  }
  return false;
}

bool ThreadPool::Steal(uint32_t gen, int self, int* begin, int* end) {
  for (int i = 1; i < num_threads_; ++i) {
    std::atomic<uint64_t>& other = shares_[(self + i) % num_threads_].word;
    uint64_t w = other.load(std::memory_order_acquire);
    while (GenOf(w) == gen && BeginOf(w) < EndOf(w)) {
      const int left = EndOf(w) - BeginOf(w);
      const int take = (left + 1) / 2;
      if (other.compare_exchange_weak(w, w - static_cast<uint64_t>(take), std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        *begin = EndOf(w) - take;
        *end = EndOf(w);
        return true;
      }
    }
  }
  return false;
}

void ThreadPool::Work(uint32_t gen, int self) {
  // A successful claim proves the job is still live: the caller waits for every claimed unit
  // before it returns, so job_ stays valid until this claim is done. Units are counted in done_
  // once per run of claims from the own share (one transfer of that line, not one per claim).
  std::atomic<uint64_t>& own = shares_[self].word;
  int begin = 0, end = 0;
  int64_t done = 0;
  while (true) {
    while (ClaimOwn(gen, self, &begin, &end)) {
      (*job_)(begin, end);
      done += end - begin;
    }
    if (done > 0) done_.fetch_add(done, std::memory_order_acq_rel);
    done = 0;
    if (!Steal(gen, self, &begin, &end)) return;
    // The stolen units become this participant's share, claimed front to back like its own and
    // open to stealing in turn. The share is empty (nobody else writes an empty share) and the
    // job cannot end before these units are done, so this store can overwrite nothing.
    own.store(ShareWord(gen, begin, end), std::memory_order_release);
  }
}

void ThreadPool::WorkerLoop(int self) {
  uint32_t seen = 0;
  while (true) {
    uint32_t gen = current_.load(std::memory_order_acquire);
    for (int spins = 0; gen == seen && spins < kSpinIterations; ++spins) {
      CpuRelax();
      gen = current_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lock, [&] { return current_.load(std::memory_order_seq_cst) != seen; });
      sleepers_.fetch_sub(1);
      gen = current_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    Work(gen, self);
  }
}

void ThreadPool::RunUnits(int units, const std::function<void(int, int)>& fn) {
  if (num_threads_ == 1 || units == 1) {
    fn(0, units);
    return;
  }
  job_ = &fn;
  done_target_ += units;
  ++generation_;
  // Shares before the generation: a worker that sees the job finds them dealt. (Every share of
  // the previous job is empty, so no late claim can take from these.)
  for (int p = 0; p < num_threads_; ++p) {
    const int begin = static_cast<int>(int64_t{units} * p / num_threads_);
    const int end = static_cast<int>(int64_t{units} * (p + 1) / num_threads_);
    shares_[p].word.store(ShareWord(generation_, begin, end), std::memory_order_release);
  }
  // No mutex on this path: a worker going to sleep counts itself in sleepers_ and then checks
  // current_ (both seq_cst), the caller publishes current_ and then checks sleepers_ (seq_cst):
  // one of the two sees the other. A sleeper found here holds or waits on the mutex, so taking
  // it before notifying cannot slip between its check and its wait.
  current_.store(generation_, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
  }
  Work(generation_, 0);
  for (int spins = 0; done_.load(std::memory_order_acquire) != done_target_; ++spins) {
    if (spins < kJoinSpinsBeforeYield) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
}

void ThreadPool::Run(const std::function<void(int, int)>& fn) {
  RunUnits(num_threads_, [&](int begin, int end) {
    for (int t = begin; t < end; ++t) fn(t, num_threads_);
  });
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  ParallelForGrain(n, 1, fn);
}

void ThreadPool::ParallelForGrain(int64_t n, int64_t grain,
                                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t units = (n + grain - 1) / grain;
  if (units > kMaxUnits) {  // coarser units, still multiples of grain
    grain *= (units + kMaxUnits - 1) / kMaxUnits;
    units = (n + grain - 1) / grain;
  }
  if (num_threads_ == 1 || units == 1) {
    fn(0, n);
    return;
  }
  RunUnits(static_cast<int>(units),
           [&](int begin, int end) { fn(begin * grain, std::min(n, end * grain)); });
}

}  // namespace tandem
