#include "common/base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ThreadPoolTest, ParallelForCoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPoolTest, GrainAlignsRanges) {
  ThreadPool pool(3);
  std::atomic<int> misaligned{0};
  std::atomic<int64_t> total{0};
  pool.ParallelForGrain(1000, 16, [&](int64_t b, int64_t e) {
    if (b % 16 != 0) misaligned.fetch_add(1);
    total.fetch_add(e - b);
  });
  EXPECT_EQ(misaligned.load(), 0);
  EXPECT_EQ(total.load(), 1000);
}

TEST(ThreadPoolTest, ManyShortJobsBackToBack) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 20000; ++job) {
    pool.Run([&](int tid, int nt) { sum.fetch_add(tid + 1); });
  }
  EXPECT_EQ(sum.load(), 20000 * 3);
}

TEST(ThreadPoolTest, SleepingWorkersWakeForTheNextJob) {
  // Between jobs the workers spin briefly, then sleep; the caller publishes a job without a lock
  // and wakes sleepers only when it sees one. A lost wakeup would not hang the job (the caller
  // takes every ticket itself) but would leave the worker out: each ticket here waits for the
  // other to start, so a job run by one thread alone takes the whole deadline and fails.
  ThreadPool pool(2);
  for (int job = 0; job < 20; ++job) {
    std::this_thread::sleep_for(std::chrono::milliseconds(job % 2 == 0 ? 30 : 0));
    std::atomic<int> started{0};
    std::mutex mu;
    std::vector<std::thread::id> ran;
    pool.Run([&](int, int) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ran.push_back(std::this_thread::get_id());
      }
      started.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
    });
    ASSERT_EQ(ran.size(), 2u);
    EXPECT_NE(ran[0], ran[1]) << "job " << job << " ran on one thread: a worker missed its wakeup";
  }
}

TEST(ThreadPoolTest, ClaimedRangesCoverEveryJobUnderChurn) {
  // Jobs of every size back to back: a worker that wakes late for one job must never claim a
  // ticket of the next (TSan runs this too).
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    for (int job = 0; job < 3000; ++job) {
      const int64_t n = job % 37;
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelForGrain(n, 1 + job % 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << job;
    }
  }
}

TEST(ThreadPoolTest, EachThreadRunsItsShareFrontToBackThenStealsFromTheOtherBack) {
  // Two participants: each runs consecutive tickets of its own share in order (one stream
  // through memory), then, if any are left, the other share's from its back.
  ThreadPool pool(2);
  for (int job = 0; job < 2000; ++job) {
    const int64_t n = 2 + job % 40;
    std::mutex mu;
    std::map<std::thread::id, std::vector<int64_t>> seen;
    pool.ParallelFor(n, [&](int64_t b, int64_t) {
      std::lock_guard<std::mutex> lock(mu);
      seen[std::this_thread::get_id()].push_back(b);
    });
    std::vector<int64_t> starts;  // range starts in order, to map a start to its ticket
    pool.ParallelFor(n, [&](int64_t b, int64_t) {
      std::lock_guard<std::mutex> lock(mu);
      starts.push_back(b);
    });
    std::sort(starts.begin(), starts.end());
    auto ticket = [&](int64_t b) {
      return std::lower_bound(starts.begin(), starts.end(), b) - starts.begin();
    };
    size_t total = 0;
    for (const auto& [id, begins] : seen) {
      total += begins.size();
      size_t i = 1;
      while (i < begins.size() && ticket(begins[i]) == ticket(begins[i - 1]) + 1) ++i;
      // Then (after its share) the other share's tickets from its back, one below the other.
      for (++i; i < begins.size(); ++i) {
        ASSERT_EQ(ticket(begins[i]), ticket(begins[i - 1]) - 1) << "job " << job;
      }
    }
    ASSERT_EQ(total, starts.size());
  }
}

TEST(ThreadPoolTest, RangesDependOnlyOnTheSizeAndThePool) {
  ThreadPool pool(3);
  auto ranges = [&] {
    std::vector<std::atomic<int64_t>> end_of(1000);
    pool.ParallelForGrain(1000, 16, [&](int64_t b, int64_t e) { end_of[b].store(e); });
    std::vector<int64_t> out;
    for (auto& e : end_of) out.push_back(e.load());
    return out;
  };
  const auto first = ranges();
  int count = 0;
  for (int64_t e : first) count += e != 0;
  EXPECT_EQ(count, 3 * ThreadPool::kRangesPerThread);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(ranges(), first);
}

}  // namespace
}  // namespace tandem
