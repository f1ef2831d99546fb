// AsyncEngine under concurrent callers (run under ThreadSanitizer by
// scripts/sanitize.sh): threads submit, cancel, finish samples, post work and read stats while
// the engine thread steps. Every request hears exactly its endings, greedy outputs of the requests
// left alone equal a synchronous engine's, and every block returns to the pool, also with injected
// allocation failures and stalls and when the engine shuts down with requests in flight.

#include "common/engine/async_engine.h"

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/engine/engine_builder.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

std::unique_ptr<Engine> MakeEngine(const EngineFaultOptions& faults) {
  EngineBuildOptions b;
  b.model_dir = tandem::TestSourceDir() + "/models/stories260k";
  b.num_kv_blocks = 48;
  b.show_progress = false;
  b.threads = 2;
  b.engine.faults = faults;
  b.engine.faults_from_env = false;
  b.engine.scheduler.max_num_batched_tokens = 64;
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return std::move(built->engine);
}

EngineRequest MakeRequest(int i) {
  std::mt19937 rng(i);
  EngineRequest r;
  r.id = "r" + std::to_string(i);
  r.prompt = {1};
  const int len = std::uniform_int_distribution<int>(1, 50)(rng);
  for (int k = 0; k < len; ++k) r.prompt.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
  r.params.max_tokens = std::uniform_int_distribution<int>(1, 30)(rng);
  r.params.ignore_eos = true;
  r.params.temperature = 0;
  r.n = i % 5 == 0 ? 2 : 1;
  return r;
}

struct Outcome {
  std::map<int32_t, std::vector<int32_t>> tokens;
  int finished = 0;
  int errors = 0;
  bool aborted = false;
};

void RunConcurrently(const EngineFaultOptions& faults) {
  constexpr int kThreads = 4, kPerThread = 12;
  // Reference: the same requests on a synchronous engine, one at a time.
  std::map<std::string, std::map<int32_t, std::vector<int32_t>>> want;
  {
    auto sync = MakeEngine({});
    for (int i = 0; i < kThreads * kPerThread; ++i) {
      EngineRequest r = MakeRequest(i);
      ASSERT_TRUE(sync->AddRequest(r).ok());
      while (sync->HasWork()) {
        for (const auto& u : sync->Step()) {
          auto& v = want[u.request_id][u.index];
          v.insert(v.end(), u.new_tokens.begin(), u.new_tokens.end());
        }
      }
    }
  }

  AsyncEngine engine(MakeEngine(faults));
  std::mutex mu;
  std::map<std::string, Outcome> outcomes;
  std::atomic<bool> stop_reader{false};
  std::thread reader([&] {  // stats from another thread while the engine runs
    while (!stop_reader.load()) {
      EXPECT_GE(engine.stats().kv_blocks_total, 48);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      for (int k = 0; k < kPerThread; ++k) {
        const int i = t * kPerThread + k;
        EngineRequest r = MakeRequest(i);
        const std::string id = r.id;
        engine.Submit(std::move(r), [&, id](const SequenceUpdate& u) {
          std::lock_guard<std::mutex> lock(mu);
          Outcome& o = outcomes[id];
          auto& v = o.tokens[u.index];
          v.insert(v.end(), u.new_tokens.begin(), u.new_tokens.end());
          if (u.finished) {
            ++o.finished;
            if (!u.status.ok()) ++o.errors;
            if (u.finish_reason == FinishReason::kAbort) o.aborted = true;
          }
        });
        const int action = std::uniform_int_distribution<int>(0, 9)(rng);
        if (action == 0) engine.Cancel(id);
        if (action == 1) engine.FinishSequence(id, 0, FinishReason::kAbort);
        if (action == 2) engine.Post([](Engine& e) { (void)e.stats(); });
        if (action == 3)
          engine.RunOnEngineThread([](Engine& e) { EXPECT_TRUE(e.HasWork() || true); });
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      }
    });
  }
  for (auto& c : clients) c.join();
  for (int waited = 0; engine.num_active_requests() > 0 && waited < 60000; waited += 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop_reader = true;
  reader.join();
  ASSERT_EQ(engine.num_active_requests(), 0);

  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(kThreads * kPerThread));
  for (const auto& [id, o] : outcomes) {
    const int n = MakeRequest(std::stoi(id.substr(1))).n;
    EXPECT_EQ(o.errors, 0) << id;
    EXPECT_EQ(o.finished, n) << id << ": one ending per sample";
    if (!o.aborted) {
      EXPECT_EQ(o.tokens, want[id]) << id;
    }
  }
  EngineStats s = engine.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
}

TEST(AsyncEngineTest, ConcurrentCallersGetExactOutputsAndLeakNothing) { RunConcurrently({}); }

TEST(AsyncEngineTest, SameUnderRefusedAllocationsAndStalls) {
  EngineFaultOptions faults;
  faults.alloc_fail_prob = 0.2;
  faults.stall_ms = 1;
  faults.stall_prob = 0.05;
  faults.seed = 3;
  RunConcurrently(faults);
}

// A caller that has heard the end of its (only) request reads stats in which it no longer runs
// or holds blocks: the engine thread publishes each step's stats before delivering its updates.
TEST(AsyncEngineTest, StatsSeenAfterTheLastUpdateReflectIt) {
  AsyncEngine engine(MakeEngine({}));
  for (int i = 0; i < 10; ++i) {
    std::promise<void> done;
    EngineRequest r = MakeRequest(i);
    r.n = 1;
    engine.Submit(std::move(r), [&](const SequenceUpdate& u) {
      if (u.finished) done.set_value();
    });
    done.get_future().wait();
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.num_running, 0) << "request " << i;
    EXPECT_EQ(s.num_waiting, 0) << "request " << i;
    EXPECT_EQ(s.kv_blocks_used, 0) << "request " << i;
  }
}

TEST(AsyncEngineTest, ShutdownWithRequestsInFlightEndsEveryOne) {
  std::atomic<int> finished{0};
  {
    AsyncEngine engine(MakeEngine({}));
    for (int i = 0; i < 20; ++i) {
      EngineRequest r = MakeRequest(i);
      r.params.max_tokens = 200;
      r.n = 1;
      engine.Submit(std::move(r), [&](const SequenceUpdate& u) {
        if (u.finished) finished.fetch_add(1);
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }  // the destructor aborts what is left
  EXPECT_EQ(finished.load(), 20);
}

}  // namespace
}  // namespace tandem
