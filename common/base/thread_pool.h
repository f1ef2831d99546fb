#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

// A fixed team of compute threads for data-parallel kernels. The calling thread takes part, so a
// pool of size N starts N-1 threads and never oversubscribes N cores.
//
// Work claiming: a job is a number of tickets, dealt out in N consecutive shares, one per
// participant (the caller is participant 0). Each participant claims its own share's tickets
// from the front, one at a time, then takes the others' left from their back, until none is
// left; the job ends when every claimed ticket is done. So a participant runs consecutive
// tickets (one stream through memory: a kernel's prefetch past the end of a ticket feeds the
// next one it runs, where tickets dealt round robin sent it into another thread's), and a worker
// that is descheduled (another process took its core) or still asleep simply claims nothing: the
// others take its share, and the caller never waits for a thread that has not started work.
// Which thread runs a ticket never changes what the ticket computes.
//
// Workers spin briefly between jobs (decode steps issue many short jobs back to back), then sleep.
// Run() may be called from one thread at a time (the engine thread); it is not reentrant.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Calls fn(ticket, size()) once for every ticket in [0, size()) and returns when all are done.
  // Tickets may run on any participant, several on one thread (one after the other).
  void Run(const std::function<void(int ticket, int num_tickets)>& fn);

  // Splits [0, n) into ranges and calls fn(begin, end) once per range. The ranges depend only on
  // n and size(), never on timing; there are up to kRangesPerThread per thread, so a late thread's
  // ranges are taken by the others.
  void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

  // Like ParallelFor, but ranges are multiples of `grain` (except the last).
  void ParallelForGrain(int64_t n, int64_t grain,
                        const std::function<void(int64_t begin, int64_t end)>& fn);

  // 8: the last range a thread finishes while the other waits is 1/16 of a 2-thread job (with 4,
  // batch-1 decode spent ~10% of its time joining; 8 measured 1.03-1.05x faster). With shares
  // per participant 8 still beats 32 on jobs of a few hundred KB (0.92x: more claims and range
  // ends for every job).
  static constexpr int kRangesPerThread = 8;

 private:
  // Runs fn(ticket, tickets) for every ticket in [0, tickets), 1 <= tickets <= kMaxTickets.
  void RunTickets(int tickets, const std::function<void(int, int)>& fn);
  // Claims a ticket of job `gen` for participant `self` from the front of its own share; false
  // when that is empty (or the job is over).
  bool ClaimOwn(uint32_t gen, int self, int* ticket);
  // Claims a ticket of job `gen` from the back of another participant's share; false when the
  // job has none left (or is over).
  bool Steal(uint32_t gen, int self, int* ticket);
  // Runs job `gen`'s tickets as participant `self` until none is left to claim.
  void Work(uint32_t gen, int self);
  void WorkerLoop(int self);

  static constexpr int kMaxTickets = 0xffff;

  // One participant's share of the current job: (generation << 32) | (begin << 16) | end, the
  // tickets [begin, end) not yet claimed, one word so that a claim can never mix one job's
  // generation with another's counts; on a cache line of its own.
  struct alignas(64) Share {
    std::atomic<uint64_t> word{0};
  };

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::vector<Share> shares_;  // one per participant
  uint32_t generation_ = 0;    // the caller's copy of the current job's generation
  int64_t done_target_ = 0;    // the caller's: done_ once the current job is over
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};

  // What a worker reads to start a job, on one cache line that only the caller writes (once per
  // job): a worker that sees the generation gets the rest in the same transfer. A cache line
  // moving between the two cores of the development VM takes ~275 ns, and a fork/join is a
  // chain of such moves: the pool keeps it short (tests/bench/thread_pool_bench.cc).
  alignas(64) std::atomic<uint32_t> current_{0};  // generation of the current job
  int tickets_ = 0;                               // of the current job
  const std::function<void(int, int)>* job_ = nullptr;

  // Tickets finished over the pool's life (see Work); the caller only reads it (never resets
  // it), on a line of its own.
  alignas(64) std::atomic<int64_t> done_{0};
};

// Default pool size: the number of cores available to this process.
int DefaultComputeThreads();

}  // namespace tandem
