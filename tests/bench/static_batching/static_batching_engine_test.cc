// The static-batching baselines in an engine on the bundled model: they change what runs
// together, never a token; the fixed-shape one computes a padding row for every finished member
// of a running batch until the batch is done; every block returns. And the names exist only
// where a binary registers them: `tandem`'s flags refuse them, the benchmark server's accept them.

#include <algorithm>

#include "common/engine/engine_builder.h"
#include "common/engine/scheduling_policies.h"
#include "common/worker/engine_flags.h"
#include "gtest/gtest.h"
#include "tests/bench/static_batching/static_batching.h"
#include "tests/unit/common/engine/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using testing_util::MakeRequests;
using testing_util::Req;
using testing_util::RunAll;

std::unique_ptr<Engine> MakeEngine(EngineOptions options) {
  EngineBuildOptions b;
  b.model_dir = tandem::TestSourceDir() + "/models/stories260k";
  b.num_kv_blocks = 256;
  b.show_progress = false;
  b.threads = 1;
  b.engine = std::move(options);
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? std::move(built->engine) : nullptr;
}

TEST(StaticBatchingEngineTest, BaselinesKeepGreedyOutputAndReturnEveryBlock) {
  std::vector<Req> reqs = MakeRequests(12, 9, 70, 40);
  EngineOptions solo_options;
  solo_options.scheduler.max_num_seqs = 1;
  auto solo = RunAll(*MakeEngine(solo_options), reqs);
  int64_t expected_padding = 0;  // per batch of 4: sum over members of (longest - own) steps
  for (size_t b = 0; b < reqs.size(); b += 4) {
    int32_t longest = 0;
    for (size_t i = b; i < b + 4; ++i) longest = std::max(longest, reqs[i].max_tokens);
    for (size_t i = b; i < b + 4; ++i) expected_padding += longest - reqs[i].max_tokens;
  }
  ASSERT_GT(expected_padding, 0);
  for (StaticBaseline baseline : {StaticBaseline::kStatic, StaticBaseline::kStaticCompact}) {
    EngineOptions o;
    StaticBaselineParts parts;
    o.extensions = StaticBaselineExtensions(
        baseline, [&parts](const StaticBaselineParts& made) { parts = made; });
    o.scheduler.max_num_seqs = 4;
    o.enable_prefix_cache = false;
    auto engine = MakeEngine(o);
    ASSERT_NE(parts.batching, nullptr);
    EXPECT_EQ(RunAll(*engine, reqs), solo);
    EngineStats s = engine->stats();
    EXPECT_EQ(s.kv_blocks_used, 0);
    EXPECT_EQ(s.kv_reserved_token_slots, 0);
    if (baseline == StaticBaseline::kStatic) {
      ASSERT_NE(parts.padding, nullptr);
      EXPECT_EQ(parts.padding->rows_computed(), expected_padding);
    } else {
      EXPECT_EQ(parts.padding, nullptr);
    }
  }
}

// While a static batch runs, the padding rows' blocks count as reserved KV (the benchmark's KV
// waste figure).
TEST(StaticBatchingEngineTest, PaddingRowsCountInTheKvOccupancy) {
  EngineOptions o;
  StaticBaselineParts parts;
  o.extensions = StaticBaselineExtensions(StaticBaseline::kStatic,
                                          [&parts](const StaticBaselineParts& p) { parts = p; });
  o.scheduler.max_num_seqs = 2;
  auto engine = MakeEngine(o);
  for (int i = 0; i < 2; ++i) {
    EngineRequest r;
    r.id = std::to_string(i);
    r.prompt = {1, 5, 6, 7};
    r.params.max_tokens = i == 0 ? 2 : 30;
    r.params.ignore_eos = true;
    ASSERT_TRUE(engine->AddRequest(r).ok());
  }
  bool first_done = false;
  while (!first_done && engine->HasWork()) {
    for (const SequenceUpdate& u : engine->Step()) first_done |= u.finished;
  }
  ASSERT_TRUE(first_done);
  ASSERT_EQ(parts.batching->padding().size(), 1u);
  // Each member reserved prompt + max_tokens: request 0's 4 + 2 positions are one block of 16,
  // kept by its padding row; request 1 still runs with 4 + 30 in three.
  EXPECT_EQ(engine->stats().kv_reserved_token_slots, (1 + 3) * 16);
  while (engine->HasWork()) engine->Step();
  EXPECT_EQ(engine->stats().kv_reserved_token_slots, 0);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
}

TEST(StaticBatchingEngineTest, OnlyABinaryThatRegistersThemAcceptsTheNames) {
  auto parse = [](const std::string& policy) {
    EngineFlags flags;
    FlagSet set("test", "");
    flags.Register(&set);
    const std::string arg = "--scheduling-policy=" + policy;
    char* argv[] = {const_cast<char*>("test"), const_cast<char*>(arg.c_str())};
    EXPECT_TRUE(set.Parse(2, argv).ok());
    return flags.ToBuildOptions();
  };
  EXPECT_FALSE(parse("static").ok());
  EXPECT_FALSE(parse("static-compact").ok());
  RegisterStaticBaselines();
  EXPECT_EQ(RegisteredSchedulingPolicies(), (std::vector<std::string>{"static", "static-compact"}));
  auto parsed = parse("static");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(static_cast<bool>(parsed->engine.extensions));
  EXPECT_EQ(parsed->engine.scheduler.policy, SchedulingPolicy::kFcfs);  // within its batches
  auto fcfs = parse("fcfs");
  ASSERT_TRUE(fcfs.ok());
  EXPECT_FALSE(static_cast<bool>(fcfs->engine.extensions));
  EXPECT_FALSE(parse("lifo").ok());
}

}  // namespace
}  // namespace tandem
