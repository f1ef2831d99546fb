#include "common/base/thread_pool.h"

#include <immintrin.h>

#include <algorithm>

#include "common/base/cpu_features.h"

namespace tandem {
namespace {
constexpr int kSpinIterations = 20000;  // ~tens of microseconds before sleeping
// Spins of the joining thread before it starts yielding its core: a ticket still running on a
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

bool ThreadPool::ClaimOwn(uint32_t gen, int self, int* ticket) {
  std::atomic<uint64_t>& own = shares_[self].word;
  uint64_t w = own.load(std::memory_order_acquire);
  while (GenOf(w) == gen && BeginOf(w) < EndOf(w)) {
    if (own.compare_exchange_weak(w, w + (uint64_t{1} << 16), std::memory_order_acq_rel,
                                  std::memory_order_acquire)) {
      *ticket = BeginOf(w);
      return true;
    }
  }
  return false;
}

bool ThreadPool::Steal(uint32_t gen, int self, int* ticket) {
  for (int i = 1; i < num_threads_; ++i) {
    std::atomic<uint64_t>& other = shares_[(self + i) % num_threads_].word;
    uint64_t w = other.load(std::memory_order_acquire);
    while (GenOf(w) == gen && BeginOf(w) < EndOf(w)) {
      if (other.compare_exchange_weak(w, w - 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        *ticket = EndOf(w) - 1;
        return true;
      }
    }
  }
  return false;
}

void ThreadPool::Work(uint32_t gen, int self) {
  // A successful claim proves the job is still live: the caller waits for every claimed ticket
  // before it returns, so job_ and tickets_ stay valid until this ticket is done. Tickets of the
  // own share are counted in done_ together once the share is empty (one transfer of that line
  // per participant and job, not one per ticket), stolen ones one by one (the join waits on the
  // last of them).
  int ticket = 0, done = 0;
  while (ClaimOwn(gen, self, &ticket)) {
    (*job_)(ticket, tickets_);
    ++done;
  }
  if (done > 0) done_.fetch_add(done, std::memory_order_acq_rel);
  while (Steal(gen, self, &ticket)) {
    (*job_)(ticket, tickets_);
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::WorkerLoop(int self) {
  uint32_t seen = 0;
  while (true) {
    uint32_t gen = current_.load(std::memory_order_acquire);
    for (int spins = 0; gen == seen && spins < kSpinIterations; ++spins) {
      _mm_pause();
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

void ThreadPool::RunTickets(int tickets, const std::function<void(int, int)>& fn) {
  if (num_threads_ == 1 || tickets == 1) {
    for (int t = 0; t < tickets; ++t) fn(t, tickets);
    return;
  }
  job_ = &fn;
  tickets_ = tickets;
  done_target_ += tickets;
  ++generation_;
  // Shares before the generation: a worker that sees the job finds them dealt. (Every share of
  // the previous job is empty, so no late claim can take from these.)
  for (int p = 0; p < num_threads_; ++p) {
    const int begin = static_cast<int>(int64_t{tickets} * p / num_threads_);
    const int end = static_cast<int>(int64_t{tickets} * (p + 1) / num_threads_);
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
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
}

void ThreadPool::Run(const std::function<void(int, int)>& fn) { RunTickets(num_threads_, fn); }

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  ParallelForGrain(n, 1, fn);
}

void ThreadPool::ParallelForGrain(int64_t n, int64_t grain,
                                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t units = (n + grain - 1) / grain;
  if (num_threads_ == 1 || units == 1) {
    fn(0, n);
    return;
  }
  const int ranges = static_cast<int>(
      std::min<int64_t>({units, int64_t{num_threads_} * kRangesPerThread, kMaxTickets}));
  RunTickets(ranges, [&](int r, int nr) {
    const int64_t per = units / nr, extra = units % nr;
    const int64_t begin_u = r * per + std::min<int64_t>(r, extra);
    const int64_t end_u = begin_u + per + (r < extra ? 1 : 0);
    const int64_t begin = std::min(n, begin_u * grain), end = std::min(n, end_u * grain);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace tandem
