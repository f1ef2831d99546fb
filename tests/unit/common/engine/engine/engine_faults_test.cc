// Engine fault injection: TANDEM_FAULTS parsing shared with kvtransfer, seeded
// decisions, and an engine under refused block allocations and stalled steps that still gives
// exactly the fault-free greedy and seeded tokens and returns every block.

#include "common/engine/engine_faults.h"

#include <cstdlib>
#include <map>
#include <random>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

TEST(EngineFaultsTest, ParsesItsKeysAndSkipsTheTransferKeys) {
  auto o = ParseEngineFaultOptions(
      "engine_stall_ms=200, engine_stall_prob=0.05,kv_alloc_fail_prob=0.5,seed=7,max_faults=3,"
      "kv_corrupt=0.1,kv_drop=0.1,kv_close=0.1,kv_delay=0.5,kv_delay_ms=9");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->stall_ms, 200);
  EXPECT_DOUBLE_EQ(o->stall_prob, 0.05);
  EXPECT_DOUBLE_EQ(o->alloc_fail_prob, 0.5);
  EXPECT_EQ(o->seed, 7u);
  EXPECT_EQ(o->max_faults, 3);
  EXPECT_TRUE(o->enabled());
  auto stall_only = ParseEngineFaultOptions("engine_stall_ms=5");
  ASSERT_TRUE(stall_only.ok());
  EXPECT_DOUBLE_EQ(stall_only->stall_prob, 1.0);  // every step, like kv_delay
  EXPECT_TRUE(stall_only->stalls());
  auto transfer_only = ParseEngineFaultOptions("kv_corrupt=0.5,seed=1");
  ASSERT_TRUE(transfer_only.ok());
  EXPECT_FALSE(transfer_only->enabled());
  EXPECT_FALSE(ParseEngineFaultOptions("")->enabled());
}

TEST(EngineFaultsTest, RejectsMalformedSpecs) {
  EXPECT_FALSE(ParseEngineFaultOptions("kv_alloc_fail_prob=1.5").ok());
  EXPECT_FALSE(ParseEngineFaultOptions("engine_stall_prob=-0.1").ok());
  EXPECT_FALSE(ParseEngineFaultOptions("engine_stall_ms=-1").ok());
  EXPECT_FALSE(ParseEngineFaultOptions("engine_stall_ms").ok());
  EXPECT_FALSE(ParseEngineFaultOptions("engine_bogus=1").ok());
  EXPECT_FALSE(ParseEngineFaultOptions("seed=x").ok());
}

TEST(EngineFaultsTest, EnvironmentEnablesWhenOptionsDoNot) {
  setenv("TANDEM_FAULTS", "kv_alloc_fail_prob=0.25,kv_drop=0.5", 1);
  EngineFaultOptions none;
  EXPECT_DOUBLE_EQ(ResolveEngineFaultOptions(none, true).alloc_fail_prob, 0.25);
  EXPECT_FALSE(ResolveEngineFaultOptions(none, false).enabled());
  EngineFaultOptions explicit_options;
  explicit_options.stall_ms = 1;
  EXPECT_DOUBLE_EQ(ResolveEngineFaultOptions(explicit_options, true).alloc_fail_prob, 0);
  setenv("TANDEM_FAULTS", "garbage", 1);
  EXPECT_FALSE(ResolveEngineFaultOptions(none, true).enabled());
  unsetenv("TANDEM_FAULTS");
  EXPECT_FALSE(ResolveEngineFaultOptions(none, true).enabled());
}

TEST(EngineFaultsTest, SeededDecisionsAreReproducibleAndBounded) {
  EngineFaultOptions o;
  o.alloc_fail_prob = 0.3;
  o.stall_ms = 1;
  o.stall_prob = 0.2;
  o.seed = 42;
  EngineFaultInjector a(o), b(o);
  int failures = 0, stalls = 0;
  for (int i = 0; i < 2000; ++i) {
    const bool fa = a.FailAllocation();
    ASSERT_EQ(fa, b.FailAllocation());
    const absl::Duration sa = a.NextStall();
    ASSERT_EQ(sa, b.NextStall());
    failures += fa;
    stalls += sa > absl::ZeroDuration();
  }
  EXPECT_NEAR(failures, 600, 120);
  EXPECT_NEAR(stalls, 400, 100);
  EXPECT_EQ(a.injected(), failures + stalls);

  o.max_faults = 5;
  EngineFaultInjector capped(o);
  int total = 0;
  for (int i = 0; i < 1000; ++i) total += capped.FailAllocation();
  EXPECT_EQ(total, 5);
  EXPECT_EQ(capped.NextStall(), absl::ZeroDuration());

  EngineFaultInjector off(EngineFaultOptions{});
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(off.FailAllocation());
    EXPECT_EQ(off.NextStall(), absl::ZeroDuration());
  }
}

std::unique_ptr<Engine> MakeEngine(const EngineFaultOptions& faults, int64_t num_blocks) {
  EngineBuildOptions b;
  b.model_dir = tandem::TestSourceDir() + "/models/stories260k";
  b.num_kv_blocks = num_blocks;
  b.show_progress = false;
  b.threads = 1;
  b.engine.faults = faults;
  b.engine.faults_from_env = false;
  b.engine.scheduler.max_num_batched_tokens = 64;  // chunked prefills
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return std::move(built->engine);
}

// Runs 16 requests (n = 2, some greedy, some seeded sampling) to completion.
std::map<std::string, std::vector<int32_t>> RunAll(Engine& engine) {
  std::mt19937 rng(3);
  for (int i = 0; i < 16; ++i) {
    EngineRequest r;
    r.id = std::to_string(i);
    r.prompt = {1};
    const int len = std::uniform_int_distribution<int>(1, 60)(rng);
    for (int k = 0; k < len; ++k) {
      r.prompt.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    }
    r.params.max_tokens = std::uniform_int_distribution<int>(1, 40)(rng);
    r.params.ignore_eos = true;
    r.params.temperature = i % 2 == 0 ? 0.0f : 0.8f;
    r.params.seed = 100 + i;
    r.n = 2;
    EXPECT_TRUE(engine.AddRequest(r).ok());
  }
  std::map<std::string, std::vector<int32_t>> out;
  int finished = 0;
  for (int steps = 0; engine.HasWork(); ++steps) {
    EXPECT_LT(steps, 100000) << "no progress";
    if (steps >= 100000) break;
    for (const SequenceUpdate& u : engine.Step()) {
      auto& v = out[u.request_id + "/" + std::to_string(u.index)];
      v.insert(v.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) {
        EXPECT_TRUE(u.status.ok()) << u.status;
        ++finished;
      }
    }
  }
  EXPECT_EQ(finished, 32);
  return out;
}

TEST(EngineFaultsTest, RefusedAllocationsAndStallsChangeNoTokenAndLeakNoBlock) {
  auto clean = MakeEngine({}, 24);
  const auto want = RunAll(*clean);
  EXPECT_EQ(clean->stats().kv_blocks_used, 0);

  EngineFaultOptions faults;
  faults.alloc_fail_prob = 0.3;
  faults.stall_ms = 1;
  faults.stall_prob = 0.02;
  faults.seed = 11;
  auto faulty = MakeEngine(faults, 24);
  const auto got = RunAll(*faulty);
  EXPECT_EQ(got, want);
  const EngineStats s = faulty->stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
  EXPECT_GT(s.preemptions, clean->stats().preemptions) << "refused allocations preempt";
}

TEST(EngineFaultsTest, RefusedReservationIsDeferredNotLost) {
  EngineFaultOptions faults;
  faults.alloc_fail_prob = 0.9;
  faults.seed = 5;
  auto d = MakeEngine(faults, 64);
  EngineRequest r;
  r.id = "remote";
  r.prompt = {1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170};
  r.params.max_tokens = 4;
  r.remote_prefill = true;
  ASSERT_TRUE(d->AddRequest(r).ok());
  int steps = 0;
  std::optional<KvReservation> reservation;
  for (; steps < 1000 && !reservation.has_value(); ++steps) {
    for (const auto& u : d->Step()) {
      EXPECT_TRUE(u.status.ok()) << u.status;
      if (u.reservation.has_value()) reservation = u.reservation;
    }
  }
  ASSERT_TRUE(reservation.has_value());
  EXPECT_EQ(reservation->blocks.size(), 2u);
  EXPECT_EQ(d->stats().num_awaiting_kv, 1);
  d->AbortRequest("remote");
  for (const auto& u : d->Step()) EXPECT_TRUE(u.finished);
  EXPECT_EQ(d->stats().kv_blocks_used, 0);
  EXPECT_EQ(d->stats().num_awaiting_kv, 0);
}

}  // namespace
}  // namespace tandem
