// GrammarCompileService: compilation on worker threads with fairness across tenants, a CPU
// budget per compilation, deduplication, cancellation and readiness callbacks.

#include "common/grammar/compile_service.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grammar/matcher.h"
#include "gtest/gtest.h"

namespace tandem::grammar {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Every string of one to three lowercase letters, 2000 longer lowercase words (4 to 10 letters,
// as real vocabularies have), the digits, and a few others: 20k tokens.
std::shared_ptr<const TokenVocab> Vocab() {
  static const auto* vocab = new std::shared_ptr<const TokenVocab>([] {
    std::vector<std::string> bytes;
    std::string s;
    for (char a = 'a'; a <= 'z'; ++a) {
      bytes.push_back(std::string(1, a));
      for (char b = 'a'; b <= 'z'; ++b) {
        bytes.push_back(std::string{a, b});
        for (char c = 'a'; c <= 'z'; ++c) bytes.push_back(std::string{a, b, c});
      }
    }
    uint32_t x = 12345;
    auto next = [&x] { return (x = x * 1664525u + 1013904223u) >> 24; };
    for (int i = 0; i < 2000; ++i) {
      std::string word;
      for (int n = 4 + next() % 7; n > 0; --n) word.push_back(static_cast<char>('a' + next() % 26));
      bytes.push_back(word);
    }
    for (char d = '0'; d <= '9'; ++d) bytes.push_back(std::string(1, d));
    for (const char* t : {" ", ".", "-", "{\"", "\":", "\"}"}) bytes.push_back(t);
    return TokenVocab::FromBytes(bytes);
  }());
  return *vocab;
}

Constraint Regex(const std::string& value) {
  Constraint c;
  c.kind = Constraint::Kind::kRegex;
  c.value = value;
  return c;
}

// Large but legal: nested bounded repetitions whose first mask costs about 40 ms of CPU (n = 40)
// of Earley work over this vocabulary; `i` makes each one distinct (no cache hit, no dedup).
Constraint Large(int i, int n = 40) {
  return Regex(absl::StrCat("([a-z]{0,", n, "}){0,", n, "}-[0-9]{", i % 900 + 1, "}"));
}
// Legal and pathological: its first mask alone takes about 10 s of CPU.
Constraint Pathological() { return Regex("([a-z]{0,1000}){0,1000}"); }
Constraint Small(int i) { return Regex(absl::StrCat("[a-c]{", i + 1, "}\\.")); }

std::shared_ptr<GrammarCompiler> NewCompiler() {
  return std::make_shared<GrammarCompiler>(Vocab());
}

// Waits (polling, as an engine loop would) until `pred` holds or `seconds` pass.
template <typename Pred>
bool WaitFor(Pred pred, double seconds) {
  const auto t0 = Clock::now();
  while (!pred()) {
    if (Seconds(t0) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(CompileServiceTest, CompilesOnAWorkerAndCallsBackOnce) {
  GrammarCompileService service(NewCompiler());
  std::atomic<int> calls{0};
  std::atomic<bool> other_thread{false};
  const std::thread::id me = std::this_thread::get_id();
  auto handle = service.Submit("a", Small(3), [&] {
    ++calls;
    other_thread = std::this_thread::get_id() != me;
  });
  ASSERT_TRUE(WaitFor([&] { return handle->ready(); }, 30));
  ASSERT_TRUE(handle->result().ok()) << handle->result().status();
  ASSERT_TRUE(WaitFor([&] { return calls.load() == 1; }, 5));
  EXPECT_TRUE(other_thread);
  GrammarMatcher m(*handle->result());
  EXPECT_TRUE(m.AcceptBytes("abca."));
  EXPECT_TRUE(m.IsTerminated());
  // The first mask was computed by the compile: a sequence's first step finds it cached.
  EXPECT_NE(GrammarMatcher(*handle->result()).CachedMask(), nullptr);
  // Cached now: answered inside Submit, no callback.
  std::atomic<int> again_calls{0};
  auto again = service.Submit("b", Small(3), [&] { ++again_calls; });
  ASSERT_TRUE(again->ready());
  EXPECT_EQ(*again->result(), *handle->result());
  // A constraint that does not compile: INVALID_ARGUMENT through the same path.
  auto bad = service.Submit("a", Regex("(?<=x)a"));
  ASSERT_TRUE(WaitFor([&] { return bad->ready(); }, 30));
  EXPECT_EQ(bad->result().status().code(), absl::StatusCode::kInvalidArgument);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(again_calls.load(), 0);
  const GrammarCompileServiceStats s = service.stats();
  EXPECT_EQ(s.submitted, 3);
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_TRUE(s.tenants.empty());
  EXPECT_EQ(s.memory.entries, 1);
}

// Tenant A keeps its queue full of large regexes (resubmitting as they finish); tenant B's small
// grammars must not wait behind A's queue: between B's submission and its answer at most the
// compilation A had running completes (first-come-first-served would run A's whole backlog of
// 32 first), and B's latency stays bounded.
void FloodingTenantDelaysOnlyItself(int threads) {
  GrammarCompileServiceOptions options;
  options.threads = threads;
  GrammarCompileService service(NewCompiler(), options);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> a_done{0};
  std::thread flood([&] {
    std::vector<std::unique_ptr<GrammarCompileHandle>> live;
    int next = 0;
    while (!stop) {
      for (auto it = live.begin(); it != live.end();) {
        if ((*it)->ready()) {
          if ((*it)->result().ok()) ++a_done;
          it = live.erase(it);
        } else {
          ++it;
        }
      }
      while (live.size() < 32) live.push_back(service.Submit("A", Large(next++)));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  auto a_pending = [&] {
    for (const auto& t : service.stats().tenants) {
      if (t.tenant == "A") return t.pending;
    }
    return int64_t{0};
  };
  ASSERT_TRUE(WaitFor([&] { return a_pending() >= 16 && a_done.load() >= 1; }, 60));
  double worst = 0;
  for (int i = 0; i < 4; ++i) {
    const int64_t a_before = a_done.load();
    const auto t0 = Clock::now();
    auto b = service.Submit("B", Small(100 + i));
    ASSERT_TRUE(WaitFor([&] { return b->ready(); }, 60));
    const double latency = Seconds(t0);
    ASSERT_TRUE(b->result().ok()) << b->result().status();
    // A's compilations answered meanwhile: the one running when B arrived, and one seen late
    // or finishing while B's answer was read (first-come-first-served: about 30).
    EXPECT_LE(a_done.load() - a_before, 2) << "B waited behind A's queue";
    EXPECT_GE(a_pending(), 8);  // A kept flooding all along
    worst = std::max(worst, latency);
  }
  stop = true;
  flood.join();
  const GrammarCompileServiceStats s = service.stats();
  const double a_mean = s.compile_seconds / std::max<int64_t>(1, s.compiles);
  std::printf(
      "threads %d: B's worst latency %.1f ms; a compilation takes %.1f ms on average "
      "(%.1f ms at most)\n",
      threads, worst * 1e3, a_mean * 1e3, s.max_compile_seconds * 1e3);
  // Bounded: about one of A's compilations plus B's own (first-come-first-served: 32 of A's).
  EXPECT_LT(worst, 4 * s.max_compile_seconds + 1.0);
}

TEST(CompileServiceTest, FloodingTenantDelaysOnlyItselfOneWorker) {
  FloodingTenantDelaysOnlyItself(1);
}

TEST(CompileServiceTest, FloodingTenantDelaysOnlyItselfDefaultPool) {
  FloodingTenantDelaysOnlyItself(GrammarCompileServiceOptions{}.threads);
}

TEST(CompileServiceTest, PathologicalGrammarIsCutAtItsBudgetAndFreesItsWorker) {
  GrammarCompileServiceOptions options;
  options.threads = 1;
  options.budget_ms = 200;
  GrammarCompileService service(NewCompiler(), options);
  const auto t0 = Clock::now();
  auto slow = service.Submit("a", Pathological());
  auto next = service.Submit("b", Small(1));  // queued behind it on the only worker
  ASSERT_TRUE(WaitFor([&] { return slow->ready(); }, 60));
  const double cut_after = Seconds(t0);
  ASSERT_FALSE(slow->result().ok());
  EXPECT_EQ(slow->result().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(slow->result().status().message().find("budget of 200 ms of CPU time"),
            std::string::npos)
      << slow->result().status();
  // The worker is free again: the next compilation completes.
  ASSERT_TRUE(WaitFor([&] { return next->ready(); }, 60));
  EXPECT_TRUE(next->result().ok()) << next->result().status();
  const GrammarCompileServiceStats s = service.stats();
  EXPECT_EQ(s.budget_exceeded, 1);
  EXPECT_EQ(s.memory.entries, 1);  // the cut grammar was not cached
  std::printf("cut after %.0f ms of wall time (budget: 200 ms of CPU)\n", cut_after * 1e3);
  // Without the budget this grammar's first mask takes about 10 s of CPU.
  EXPECT_LT(cut_after, 10.0);
}

TEST(CompileServiceTest, SynchronousCompileHonoursTheBudgetInEachPhase) {
  GrammarCompiler compiler(Vocab());
  CompileBudget warm(/*cpu_ms=*/100);  // the first mask's Earley closures and trie walk
  auto slow = compiler.Compile(Pathological(), &warm);
  ASSERT_FALSE(slow.ok());
  EXPECT_NE(slow.status().message().find("budget of 100 ms"), std::string::npos) << slow.status();
  // A JSON Schema front end with many subschemas, cut before parsing.
  std::string schema = R"({"type":"object","properties":{)";
  for (int i = 0; i < 3000; ++i) {
    absl::StrAppend(&schema, i ? "," : "", "\"p", i, R"(":{"type":"string","maxLength":8})");
  }
  absl::StrAppend(&schema, "}}");
  Constraint c;
  c.kind = Constraint::Kind::kJsonSchema;
  c.value = schema;
  CompileBudget cancelled;
  cancelled.Cancel();
  EXPECT_EQ(compiler.Compile(c, &cancelled).status().code(), absl::StatusCode::kCancelled);
  CompileBudget ample(/*cpu_ms=*/60000);
  EXPECT_TRUE(compiler.Compile(Small(2), &ample).ok());
  EXPECT_EQ(compiler.memory_stats().entries, 1);
}

// Identical constraints in flight compile once; every waiter (of any tenant) gets the result.
TEST(CompileServiceTest, IdenticalConstraintsInFlightCompileOnce) {
  GrammarCompileServiceOptions options;
  options.threads = 1;
  options.budget_ms = 300;
  GrammarCompileService service(NewCompiler(), options);
  auto blocker = service.Submit("x", Pathological());  // keeps the only worker busy
  ASSERT_TRUE(WaitFor([&] { return service.stats().running == 1; }, 30));
  std::atomic<int> calls{0};
  std::vector<std::unique_ptr<GrammarCompileHandle>> handles;
  for (const char* tenant : {"a", "b", "a", "c"}) {
    handles.push_back(service.Submit(tenant, Small(7), [&] { ++calls; }));
  }
  EXPECT_EQ(service.stats().deduplicated, 3);
  for (auto& h : handles) ASSERT_TRUE(WaitFor([&] { return h->ready(); }, 60));
  for (auto& h : handles) {
    ASSERT_TRUE(h->result().ok()) << h->result().status();
    EXPECT_EQ(*h->result(), *handles[0]->result());
  }
  ASSERT_TRUE(WaitFor([&] { return calls.load() == 4; }, 5));
  const GrammarCompileServiceStats s = service.stats();
  EXPECT_EQ(s.compiles, 2);  // the blocker and one for the four waiters
  EXPECT_EQ(s.submitted, 5);
}

TEST(CompileServiceTest, CancellingTheOnlyWaiterOfAQueuedCompileAbandonsIt) {
  GrammarCompileServiceOptions options;
  options.threads = 1;
  options.budget_ms = 300;
  GrammarCompileService service(NewCompiler(), options);
  auto blocker = service.Submit("x", Pathological());
  ASSERT_TRUE(WaitFor([&] { return service.stats().running == 1; }, 30));
  std::atomic<int> calls{0};
  auto queued = service.Submit("a", Small(11), [&] { ++calls; });
  auto kept = service.Submit("b", Small(12), [&] { ++calls; });
  queued->Cancel();
  EXPECT_TRUE(queued->ready());
  EXPECT_EQ(queued->result().status().code(), absl::StatusCode::kCancelled);
  // Dropping a handle cancels too.
  auto dropped = service.Submit("c", Small(13), [&] { ++calls; });
  dropped.reset();
  ASSERT_TRUE(WaitFor([&] { return kept->ready(); }, 60));
  ASSERT_TRUE(kept->result().ok()) << kept->result().status();
  ASSERT_TRUE(WaitFor([&] { return service.stats().running == 0; }, 30));
  const GrammarCompileServiceStats s = service.stats();
  EXPECT_EQ(s.compiles, 2);  // the blocker and `kept`: the cancelled ones never ran
  EXPECT_EQ(s.abandoned, 2);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(s.tenants.empty());
}

TEST(CompileServiceTest, CancellingTheLastWaiterStopsARunningCompile) {
  GrammarCompileServiceOptions options;
  options.threads = 1;
  options.budget_ms = 120000;  // far beyond the test: only the cancellation can stop it
  GrammarCompileService service(NewCompiler(), options);
  std::atomic<int> calls{0};
  auto first = service.Submit("a", Pathological(), [&] { ++calls; });
  auto second = service.Submit("b", Pathological(), [&] { ++calls; });  // dedup: one compile
  ASSERT_TRUE(WaitFor([&] { return service.stats().running == 1; }, 30));
  first->Cancel();  // `second` still waits: the compile goes on
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(service.stats().running, 1);
  const auto t0 = Clock::now();
  second->Cancel();
  auto next = service.Submit("c", Small(5));
  ASSERT_TRUE(WaitFor([&] { return next->ready(); }, 20))
      << "the cancelled compile kept the worker";
  EXPECT_TRUE(next->result().ok());
  std::printf("worker free %.1f ms after the last cancel\n", Seconds(t0) * 1e3);
  EXPECT_EQ(calls.load(), 0);
  const GrammarCompileServiceStats s = service.stats();
  EXPECT_EQ(s.abandoned, 1);
  EXPECT_EQ(s.budget_exceeded, 0);
}

TEST(CompileServiceTest, PendingBoundsRefuseAtOnceAndSpareOtherTenants) {
  GrammarCompileServiceOptions options;
  options.threads = 1;
  options.budget_ms = 300;
  options.max_pending_per_tenant = 3;
  options.max_pending = 5;
  GrammarCompileService service(NewCompiler(), options);
  std::vector<std::unique_ptr<GrammarCompileHandle>> a;
  for (int i = 0; i < 3; ++i) a.push_back(service.Submit("a", Pathological()));
  auto refused = service.Submit("a", Large(1));
  ASSERT_TRUE(refused->ready());
  EXPECT_EQ(refused->result().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused->result().status().message().find("this tenant has 3"), std::string::npos)
      << refused->result().status();
  auto b1 = service.Submit("b", Small(1));
  auto b2 = service.Submit("b", Small(2));
  auto full = service.Submit("c", Small(3));  // five pending in all
  ASSERT_TRUE(full->ready());
  EXPECT_EQ(full->result().status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(WaitFor([&] { return b1->ready() && b2->ready(); }, 60));
  EXPECT_TRUE(b1->result().ok());
  EXPECT_TRUE(b2->result().ok());
  EXPECT_EQ(service.stats().rejected, 2);
}

TEST(CompileServiceTest, ShutdownAnswersEveryWaiterWithoutCallbacks) {
  std::atomic<int> calls{0};
  std::vector<std::unique_ptr<GrammarCompileHandle>> handles;
  {
    GrammarCompileServiceOptions options;
    options.threads = 1;
    GrammarCompileService service(NewCompiler(), options);
    handles.push_back(service.Submit("a", Pathological(), [&] { ++calls; }));
    ASSERT_TRUE(WaitFor([&] { return service.stats().running == 1; }, 30));
    handles.push_back(service.Submit("b", Large(4), [&] { ++calls; }));
  }  // the running compile stops at its next check
  for (auto& h : handles) {
    ASSERT_TRUE(h->ready());
    EXPECT_EQ(h->result().status().code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(calls.load(), 0);
}

// Many threads submitting, cancelling and decoding at once over a small memory budget, so
// evictions, cache trims and callbacks race with compilations (run under TSan in CI).
TEST(CompileServiceTest, ConcurrentSubmitsCancelsAndDecoding) {
  GrammarCompilerOptions compiler_options;
  compiler_options.max_bytes = 4 << 20;
  auto compiler = std::make_shared<GrammarCompiler>(Vocab(), compiler_options);
  GrammarCompileServiceOptions options;
  options.threads = 2;
  options.budget_ms = 500;
  GrammarCompileService service(compiler, options);
  std::atomic<int64_t> callbacks{0}, decoded{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      const std::string tenant = absl::StrCat("t", c % 3);
      for (int i = 0; i < 12; ++i) {
        auto h = service.Submit(tenant, i % 4 == 3 ? Large(i, 8) : Small((c * 7 + i) % 9),
                                [&] { ++callbacks; });
        if ((c + i) % 5 == 0) {
          h->Cancel();
          continue;
        }
        while (!h->ready()) std::this_thread::sleep_for(std::chrono::microseconds(300));
        if (!h->result().ok()) continue;
        GrammarMatcher m(*h->result());
        for (int step = 0; step < 6 && !m.IsTerminated(); ++step) {
          auto mask = m.NextTokenMask();
          int32_t pick = -1;
          for (int32_t id = 0; id < Vocab()->size() && pick < 0; ++id) {
            if (((*mask)[id >> 6] >> (id & 63)) & 1) pick = id;
          }
          if (pick < 0 || !m.AcceptToken(pick)) break;
          ++decoded;
        }
        (void)service.stats();
      }
    });
  }
  for (auto& t : clients) t.join();
  // Cancelled compilations still running stop at their next check.
  ASSERT_TRUE(WaitFor([&] { return service.stats().tenants.empty(); }, 30));
  const GrammarCompileServiceStats s = service.stats();
  EXPECT_GT(decoded.load(), 0);
  EXPECT_EQ(s.queued + s.running, 0);
  EXPECT_LE(s.memory.bytes, 2 * compiler_options.max_bytes);
}

}  // namespace
}  // namespace tandem::grammar

namespace tandem::grammar {
namespace {

// Tasks (the engine's expensive token masks) share the tenants' queues and the budget: a
// flooding tenant's tasks wait behind its own, a task past the budget is cut with an error
// IsBudgetExceeded recognises, and a cancelled running task stops.
TEST(CompileServiceTest, TasksRunOnTheTenantsTurnWithinTheBudget) {
  GrammarCompileServiceOptions options;
  options.threads = 1;
  options.budget_ms = 100;
  GrammarCompileService service(NewCompiler(), options);
  // A task that spins until its budget stops it.
  auto spin = [](CompileBudget* budget) {
    while (true) {
      if (absl::Status st = budget->Check(); !st.ok()) return st;
    }
  };
  auto hog = service.SubmitTask("a", "spinning", spin);
  ASSERT_TRUE(WaitFor([&] { return service.stats().running == 1; }, 60));
  auto hog2 = service.SubmitTask("a", "spinning", spin);
  std::atomic<bool> hog2_done_first{true};
  auto small = service.SubmitTask("b", "a small task", [&](CompileBudget*) {
    hog2_done_first = hog2->ready();
    return absl::OkStatus();
  });
  ASSERT_TRUE(WaitFor([&] { return hog->ready() && hog2->ready() && small->ready(); }, 60));
  EXPECT_TRUE(small->result().ok()) << small->result().status();
  EXPECT_EQ(small->result().value(), nullptr);
  EXPECT_FALSE(hog2_done_first) << "b's task waited only for the one running, not a's queue";
  ASSERT_FALSE(hog->result().ok());
  EXPECT_TRUE(IsBudgetExceeded(hog->result().status())) << hog->result().status();
  EXPECT_NE(hog->result().status().message().find("spinning took more than its budget of 100 ms"),
            std::string::npos)
      << hog->result().status();
  const GrammarCompileServiceStats s = service.stats();
  EXPECT_EQ(s.tasks, 3);
  EXPECT_EQ(s.tasks_failed, 2);
  EXPECT_EQ(s.tasks_budget_exceeded, 2);
  EXPECT_EQ(s.compiles, 0);

  // Cancelling a running task stops it at its next check, long before its budget.
  GrammarCompileServiceOptions unlimited;
  unlimited.threads = 1;
  unlimited.budget_ms = 0;
  GrammarCompileService forever(NewCompiler(), unlimited);
  std::atomic<bool> started{false};
  std::atomic<bool> stopped{false};
  auto running = forever.SubmitTask("a", "spinning", [&](CompileBudget* budget) {
    started = true;
    absl::Status st;
    while ((st = budget->Check()).ok()) {
    }
    stopped = true;
    return st;
  });
  ASSERT_TRUE(WaitFor([&] { return started.load(); }, 60));
  running->Cancel();
  EXPECT_EQ(running->result().status().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(WaitFor([&] { return stopped.load(); }, 60));
  EXPECT_FALSE(IsBudgetExceeded(running->result().status()));
}

}  // namespace
}  // namespace tandem::grammar
