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

TEST(ThreadPoolTest, ClaimsShrinkAsTheJobRunsOut) {
  // Each thread's claims come in runs, a claim starting where the one before ended (its share,
  // or a stolen half that became its share); within a run each claim is a quarter of what was
  // left, so sizes never grow, no claim exceeds a quarter of a share, and the job ends on claims
  // of one unit.
  ThreadPool pool(2);
  for (int job = 0; job < 500; ++job) {
    const int64_t n = 64 + job % 200;
    std::mutex mu;
    std::map<std::thread::id, std::vector<std::pair<int64_t, int64_t>>> claims;
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(mu);
      claims[std::this_thread::get_id()].push_back({b, e});
    });
    const int64_t share = (n + 1) / 2,
                  largest = (share + ThreadPool::kClaimDivisor - 1) / ThreadPool::kClaimDivisor;
    int64_t smallest = n, total = 0;
    for (const auto& [id, list] : claims) {
      for (size_t i = 0; i < list.size(); ++i) {
        const int64_t size = list[i].second - list[i].first;
        total += size;
        smallest = std::min(smallest, size);
        ASSERT_LE(size, largest) << "job " << job;
        if (i > 0 && list[i].first == list[i - 1].second) {  // the same run
          ASSERT_LE(size, list[i - 1].second - list[i - 1].first) << "job " << job;
        }
      }
    }
    ASSERT_EQ(total, n);
    EXPECT_EQ(smallest, 1) << "job " << job;
  }
}

TEST(ThreadPoolTest, OneUnitPerParticipantRunsEachShareWhole) {
  // A grain of n / size() makes one unit per participant: contiguous slices, one range each
  // (the read-bandwidth probe and prefill-sized MatMuls rely on it).
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    for (int job = 0; job < 200; ++job) {
      const int64_t n = 1000 + job;
      const int64_t grain = (n + threads - 1) / threads;
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> ranges;
      pool.ParallelForGrain(n, grain, [&](int64_t b, int64_t e) {
        std::lock_guard<std::mutex> lock(mu);
        ranges.push_back({b, e});
      });
      std::sort(ranges.begin(), ranges.end());
      ASSERT_EQ(ranges.size(), static_cast<size_t>(threads));
      for (int t = 0; t < threads; ++t) {
        ASSERT_EQ(ranges[t].first, t * grain);
        ASSERT_EQ(ranges[t].second, std::min(n, (t + 1) * grain));
      }
    }
  }
}

}  // namespace
}  // namespace tandem
