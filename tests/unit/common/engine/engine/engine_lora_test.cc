// Multi-LoRA serving through the engine (lora_feature.h): greedy output of a request is the same
// alone and in a batch mixing adapters and the base model; the prefix cache never hands KV of one
// adapter to another; --max-loras holds requests for further adapters; unloading an adapter in
// use breaks nothing.

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/engine/lora/lora_writer.h"
#include "tests/unit/common/engine/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const std::string kModel = tandem::TestSourceDir() + "/models/stories260k";

struct Outcome {
  std::map<std::string, std::vector<int32_t>> tokens;  // request id -> tokens (sample 0)
  std::map<std::string, int64_t> cached;               // request id -> cached prompt tokens
  std::map<std::string, int64_t> finished_at_step;
};

struct Job {
  std::string id;
  std::vector<int32_t> prompt;
  std::string lora;
  int32_t max_tokens = 12;
  int32_t n = 1;
};

class EngineLoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::path(::testing::TempDir()) /
             (std::string("engine_lora_") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(root_);
    auto config = LoadModelConfig(kModel + "/config.json");
    ASSERT_TRUE(config.ok());
    for (int i = 1; i <= 3; ++i) {
      RandomLoraOptions o;
      o.seed = i;
      o.rank = 8;
      o.alpha = 16;
      o.std = 0.08;
      ASSERT_TRUE(WriteRandomLoraAdapter(*config, o, Dir(i)).ok());
    }
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string Dir(int i) const { return absl::StrCat(root_, "/a", i); }

  std::unique_ptr<Engine> MakeEngine(int64_t max_loras = 4, bool lora = true,
                                     const SpecOptions& spec = SpecOptions()) {
    EngineBuildOptions b;
    b.engine.spec = spec;
    b.model_dir = kModel;
    b.num_kv_blocks = 256;
    b.show_progress = false;
    b.threads = 1;
    if (lora) {
      b.lora.max_loras = max_loras;
      b.lora.max_cpu_loras = 4;
      b.lora.modules = {"a1=" + Dir(1), "a2=" + Dir(2), "a3=" + Dir(3)};
    }
    auto built = BuildEngine(b);
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? std::move(built->engine) : nullptr;
  }

  static EngineRequest Request(const Job& j) {
    EngineRequest r;
    r.id = j.id;
    r.prompt = j.prompt;
    r.lora_name = j.lora;
    r.n = j.n;
    r.params.max_tokens = j.max_tokens;
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    return r;
  }

  // Submits `jobs` at once and steps until all end; `between(step)` runs before each step.
  static Outcome RunJobs(Engine& engine, const std::vector<Job>& jobs,
                         const std::function<void(int64_t)>& between = nullptr) {
    Outcome run;
    for (const Job& j : jobs) {
      absl::Status st = engine.AddRequest(Request(j));
      EXPECT_TRUE(st.ok()) << st;
    }
    int64_t step = 0;
    while (engine.HasWork()) {
      if (between) between(step);
      for (const SequenceUpdate& u : engine.Step()) {
        EXPECT_TRUE(u.status.ok()) << u.status;
        if (u.index != 0) continue;
        auto& t = run.tokens[u.request_id];
        t.insert(t.end(), u.new_tokens.begin(), u.new_tokens.end());
        if (u.finished) {
          run.cached[u.request_id] = u.cached_tokens;
          run.finished_at_step[u.request_id] = step;
        }
      }
      ++step;
    }
    EXPECT_EQ(engine.stats().kv_blocks_used, 0);
    return run;
  }

  std::string root_;
};

std::vector<int32_t> Prompt(uint32_t seed, int len) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p = {1};
  for (int i = 1; i < len; ++i) p.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
  return p;
}

TEST_F(EngineLoraTest, GreedyOutputTheSameAloneAndInAMixedBatch) {
  const std::vector<Job> jobs = {{"base", Prompt(1, 20), ""}, {"a1", Prompt(1, 20), "a1"},
                                 {"a2", Prompt(1, 20), "a2"}, {"a1b", Prompt(2, 33), "a1"},
                                 {"a3", Prompt(3, 7), "a3"},  {"base2", Prompt(4, 26), ""},
                                 {"a2b", Prompt(5, 40), "a2"}};
  std::map<std::string, std::vector<int32_t>> alone;
  for (const Job& j : jobs) {
    auto engine = MakeEngine();
    ASSERT_NE(engine, nullptr);
    alone[j.id] = RunJobs(*engine, {j}).tokens[j.id];
    ASSERT_EQ(alone[j.id].size(), 12u);
  }
  auto engine = MakeEngine();
  const Outcome mixed = RunJobs(*engine, jobs);
  for (const Job& j : jobs) EXPECT_EQ(mixed.tokens.at(j.id), alone[j.id]) << j.id;
  // The adapters are honoured: the same prompt continues differently under each.
  EXPECT_NE(alone["a1"], alone["base"]);
  EXPECT_NE(alone["a2"], alone["base"]);
  EXPECT_NE(alone["a1"], alone["a2"]);
}

// Speculation (n-gram, and a draft model without the adapter) verifies with the adapter: the
// same greedy tokens as without speculation.
TEST_F(EngineLoraTest, GreedyOutputTheSameWithSpeculation) {
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) {
    jobs.push_back({absl::StrCat("r", i), Prompt(20 + i, 12 + 5 * i), i % 3 == 0 ? "" : "a1", 40});
    if (i % 3 == 2) jobs.back().lora = "a2";
  }
  auto plain = MakeEngine();
  const Outcome want = RunJobs(*plain, jobs);
  for (const SpecOptions::Method method :
       {SpecOptions::Method::kNgram, SpecOptions::Method::kDraft}) {
    SpecOptions spec;
    spec.method = method;
    spec.num_speculative_tokens = 3;
    if (method == SpecOptions::Method::kDraft) {
      spec.draft_model_dir = tandem::TestSourceDir() + "/models/llama2xs-280k";
    }
    auto fast = MakeEngine(4, true, spec);
    ASSERT_NE(fast, nullptr);
    const Outcome got = RunJobs(*fast, jobs);
    EXPECT_EQ(got.tokens, want.tokens) << "method " << static_cast<int>(method);
    EXPECT_GT(fast->stats().spec_accepted_tokens, 0);
  }
}

TEST_F(EngineLoraTest, PrefixCacheKeysByAdapter) {
  auto engine = MakeEngine();
  const std::vector<int32_t> p = Prompt(9, 50);  // 3 full blocks of 16
  const Outcome base = RunJobs(*engine, {{"base", p, ""}});
  const Outcome first = RunJobs(*engine, {{"a1", p, "a1"}});
  EXPECT_EQ(first.cached.at("a1"), 0) << "adapter a1 reused the base model's KV";
  const Outcome again = RunJobs(*engine, {{"a1", p, "a1"}});
  EXPECT_EQ(again.cached.at("a1"), 48) << "a1 did not reuse its own KV";
  EXPECT_EQ(again.tokens.at("a1"), first.tokens.at("a1"));
  const Outcome other = RunJobs(*engine, {{"a2", p, "a2"}});
  EXPECT_EQ(other.cached.at("a2"), 0) << "adapter a2 reused adapter a1's KV";
  const Outcome base_again = RunJobs(*engine, {{"base", p, ""}});
  EXPECT_EQ(base_again.cached.at("base"), 48);
  EXPECT_EQ(base_again.tokens.at("base"), base.tokens.at("base"));
}

TEST_F(EngineLoraTest, RefusesAdaptersItDoesNotServe) {
  auto engine = MakeEngine();
  absl::Status st = engine->AddRequest(Request({"x", Prompt(1, 5), "nope"}));
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("LoRA adapter 'nope' is not loaded"), std::string::npos) << st;
  auto plain = MakeEngine(1, /*lora=*/false);
  st = plain->AddRequest(Request({"x", Prompt(1, 5), "a1"}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("--enable-lora"), std::string::npos) << st;
  EXPECT_FALSE(plain->HasWork());
}

TEST_F(EngineLoraTest, MaxLorasHoldsRequestsForOtherAdapters) {
  auto engine = MakeEngine(/*max_loras=*/1);
  // a1 (two requests, one with two samples) and a2: a2 waits until every a1 sample has ended;
  // the base model never waits.
  const std::vector<Job> jobs = {{"a1", Prompt(1, 20), "a1", 6},
                                 {"a2", Prompt(2, 20), "a2", 6},
                                 {"a1b", Prompt(3, 20), "a1", 9, 2},
                                 {"base", Prompt(4, 20), "", 4}};
  std::map<std::string, std::vector<int32_t>> alone;
  for (const Job& j : jobs) {
    auto e = MakeEngine(1);
    alone[j.id] = RunJobs(*e, {j}).tokens[j.id];
  }
  int64_t held_seen = 0;
  const Outcome run = RunJobs(*engine, jobs, [&](int64_t) {
    held_seen = std::max(held_seen, engine->stats().lora_requests_held);
    EXPECT_LE(engine->stats().lora_active_adapters, 1);
  });
  EXPECT_EQ(held_seen, 1);
  for (const Job& j : jobs) EXPECT_EQ(run.tokens.at(j.id), alone[j.id]) << j.id;
  EXPECT_GT(run.finished_at_step.at("a2"), run.finished_at_step.at("a1b"));
  EXPECT_LT(run.finished_at_step.at("base"), run.finished_at_step.at("a1"));
  EXPECT_EQ(engine->stats().lora_requests_held, 0);
  EXPECT_EQ(engine->stats().lora_active_adapters, 0);
}

// Decode role: a remote-prefill request for an adapter beyond --max-loras waits for a slot like
// any other, before its reservation (nothing is on its way before the reservation: the router
// starts the prefill when it arrives), so a batch never mixes more adapters than a CUDA
// backend reserved slots for, however requests arrive.
TEST_F(EngineLoraTest, RemotePrefillRequestsWaitForAnAdapterSlot) {
  auto engine = MakeEngine(/*max_loras=*/1);
  EngineRequest r1 = Request({"a1", Prompt(1, 20), "a1", 3});
  EngineRequest r2 = Request({"a2", Prompt(2, 20), "a2", 3});
  r1.remote_prefill = r2.remote_prefill = true;
  ASSERT_TRUE(engine->AddRequest(r1).ok());
  ASSERT_TRUE(engine->AddRequest(r2).ok());
  std::set<std::string> reserved;
  auto step = [&] {
    for (const SequenceUpdate& u : engine->Step()) {
      EXPECT_TRUE(u.status.ok()) << u.status;
      if (u.reservation.has_value()) reserved.insert(u.request_id);
    }
    EXPECT_LE(engine->stats().lora_active_adapters, 1);
  };
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(reserved, std::set<std::string>{"a1"});
  EXPECT_EQ(engine->stats().lora_requests_held, 1);
  // a1's prefill lands (its KV bytes do not matter here) and it decodes to its end; then a2
  // takes the slot and gets its reservation.
  ASSERT_TRUE(engine->CompleteRemotePrefill("a1", {5}, {}).ok());
  for (int i = 0; i < 20 && reserved.count("a2") == 0; ++i) step();
  EXPECT_EQ(reserved.count("a2"), 1u);
  EXPECT_EQ(engine->stats().lora_requests_held, 0);
  engine->AbortRequest("a2");
  while (engine->HasWork()) step();
  EXPECT_EQ(engine->stats().lora_active_adapters, 0);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
}

TEST_F(EngineLoraTest, AbortingAHeldRequestFreesNothingItDidNotTake) {
  auto engine = MakeEngine(/*max_loras=*/1);
  ASSERT_TRUE(engine->AddRequest(Request({"a1", Prompt(1, 20), "a1", 5})).ok());
  ASSERT_TRUE(engine->AddRequest(Request({"a2", Prompt(2, 20), "a2", 5})).ok());
  engine->Step();
  EXPECT_EQ(engine->stats().lora_requests_held, 1);
  engine->AbortRequest("a2");
  EXPECT_EQ(engine->stats().lora_requests_held, 0);
  while (engine->HasWork()) engine->Step();
  EXPECT_EQ(engine->stats().lora_active_adapters, 0);
  const Outcome later = RunJobs(*engine, {{"a3", Prompt(3, 20), "a3", 3}});
  EXPECT_EQ(later.tokens.at("a3").size(), 3u);
}

TEST_F(EngineLoraTest, UnloadingAnAdapterInUseBreaksNoRequest) {
  const Job job{"a1", Prompt(6, 30), "a1", 16};
  std::vector<int32_t> alone;
  {
    auto e = MakeEngine();
    alone = RunJobs(*e, {job}).tokens["a1"];
  }
  auto engine = MakeEngine();
  LoraRegistry& registry = *engine->lora_registry();
  const Outcome run = RunJobs(*engine, {job}, [&](int64_t step) {
    if (step != 3) return;
    auto in_use = registry.Unload("a1");
    ASSERT_TRUE(in_use.ok());
    EXPECT_EQ(*in_use, 1);
    absl::Status st = engine->AddRequest(Request({"late", Prompt(7, 5), "a1"}));
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  });
  EXPECT_EQ(run.tokens.at("a1"), alone);
  // Loaded again (the same files): served again, with the same output.
  ASSERT_TRUE(registry.Load("a1", Dir(1)).ok());
  EXPECT_EQ(RunJobs(*engine, {job}).tokens.at("a1"), alone);
}

}  // namespace
}  // namespace tandem
