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
// Work claiming: a job is a number of units (a range of elements in multiples of a grain), dealt
// out in N consecutive shares, one per participant (the caller is participant 0). Each
// participant claims from the front of its share, a quarter of what is left at a time (so
// claims shrink as the share runs out), then steals the back half of what is left in another's
// share, which becomes its own share and is claimed (and stolen from) the same way, until none
// is left; the job ends when every claimed unit is done. So a participant runs consecutive
// claims (one stream through memory: a kernel's prefetch past the end of a claim feeds the next
// one it runs), both threads end on small claims (the join waits for a fraction of a
// microsecond's work, not a sixteenth of the job), and a worker that is descheduled (another
// process took its core) or still asleep simply claims nothing: the others take its share, and
// the caller never waits for a thread that has not started work. Where the claims fall depends
// on timing; which thread runs an element never changes what is computed for it.
//
// Workers spin briefly between jobs (decode steps issue many short jobs back to back), then sleep.
// Run() may be called from one thread at a time (the engine thread); it is not reentrant.
//
// Memory order (what makes the pool correct on weakly ordered CPUs such as aarch64, not only on
// x86's TSO; no relaxed access anywhere):
// * Publishing a job: the caller writes job_, then each share (release), then current_
//   (seq_cst). A worker acquires current_, then acquires its share; a claim is a CAS (acq_rel)
//   on a share whose value comes from the caller's release store or from a stealer's release
//   store made after its own acquiring CAS, so every claim happens after job_ was written.
// * Ending a job: every unit is counted in done_ by a fetch_add (acq_rel) after its fn call;
//   the caller returns when an acquire load reads done_target_, the value of the last of those
//   read-modify-writes, so every fn call (and job_ read) happens before Run() returns and
//   before the next job's writes.
// * Stale workers: a share word carries its job's generation and every CAS compares all of it,
//   so a worker still in an old job can never claim (or steal) a newer job's units.
// * Sleeping: a worker adds itself to sleepers_ (seq_cst) under mu_ and then checks current_
//   (seq_cst); the caller stores current_ (seq_cst) and then loads sleepers_ (seq_cst): in the
//   single total order of seq_cst operations one of the two sees the other, so no wakeup is lost.
// * Spins are atomic loads in loops (never hoisted) with a spin hint (pause, yield), bounded:
//   workers sleep after some tens of microseconds, the joining caller then yields its core.
// thread_pool_test runs under TSan in CI, which reports a data race when either edge above (the
// publishing or the ending one) is weakened to relaxed.
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

  // Calls fn(begin, end) over ranges that cover [0, n) exactly once (claims, see above; where
  // they fall depends on timing) and returns when all are done.
  void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

  // Like ParallelFor, but ranges start at multiples of `grain` (units of grain elements; the
  // last may be shorter). A job of one unit (grain >= n / size(), say) runs each share whole:
  // one range per participant, contiguous slices.
  void ParallelForGrain(int64_t n, int64_t grain,
                        const std::function<void(int64_t begin, int64_t end)>& fn);

  // A participant claims ceil(left / kClaimDivisor) of its share's units at a time, so claims
  // shrink as a share runs out and every share ends on small claims: the join then waits for
  // a short last range, whichever thread ran late.
  static constexpr int kClaimDivisor = 4;

 private:
  // Runs fn(begin, end) over claims covering the units [0, units), 1 <= units <= kMaxUnits.
  void RunUnits(int units, const std::function<void(int, int)>& fn);
  // Claims the front of participant `self`'s share of job `gen`; false when it is empty (or the
  // job is over).
  bool ClaimOwn(uint32_t gen, int self, int* begin, int* end);
  // Claims the back half of another participant's share of job `gen`; false when the job has
  // none left (or is over).
  bool Steal(uint32_t gen, int self, int* begin, int* end);
  // Runs job `gen`'s claims as participant `self` until none is left.
  void Work(uint32_t gen, int self);
  void WorkerLoop(int self);

  static constexpr int kMaxUnits = 0xffff;

  // One participant's share of the current job: (generation << 32) | (begin << 16) | end, the
  // units [begin, end) not yet claimed, one word so that a claim can never mix one job's
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
  const std::function<void(int, int)>* job_ = nullptr;

  // Units finished over the pool's life (see Work); the caller only reads it (never resets
  // it), on a line of its own.
  alignas(64) std::atomic<int64_t> done_{0};
};

// Default pool size: the number of cores available to this process.
int DefaultComputeThreads();

}  // namespace tandem
