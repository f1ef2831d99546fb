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
  // Claims a ticket of job `gen` for participant `self`: the front of its own share, else the
  // back of another's; false when the job has none left (or is over).
  bool Claim(uint32_t gen, int self, int* ticket);
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
  std::vector<Share> shares_;         // one per participant
  std::atomic<uint32_t> current_{0};  // generation of the current job (what workers wait for)
  int tickets_ = 0;                   // of the current job
  std::atomic<int> done_{0};          // tickets of the current job finished
  const std::function<void(int, int)>* job_ = nullptr;
  uint32_t generation_ = 0;  // the caller's copy of the current job's generation
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

// Default pool size: the number of cores available to this process.
int DefaultComputeThreads();

}  // namespace tandem
