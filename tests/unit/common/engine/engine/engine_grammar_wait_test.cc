// Structured output off the engine loop (GrammarFeature): a request waits for its grammar's
// compilation without a slot or blocks while others keep stepping; a cached grammar never
// waits; aborting, a failed compile and one past its CPU budget end only that request; a mask
// computed off the loop keeps its sequence's slot and blocks while others step, and greedy
// output is the same as with every mask computed inline.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/grammar/compile_service.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/engine/blockable_compile_service.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

const std::string kModel = tandem::TestSourceDir() + "/models/stories260k";

std::shared_ptr<grammar::GrammarCompiler> Compiler() {
  auto c = LoadGrammarCompiler(kModel);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// By default every mask is computed inline (budgets of a minute), so the tests of compilation
// waits do not depend on how fast a mask is on this machine (under a sanitizer some pass 2 ms and
// would go to the service the test has blocked); the mask tests set the budgets they test.
std::unique_ptr<Engine> MakeEngine(std::shared_ptr<grammar::GrammarCompileService> service,
                                   int64_t mask_inline_us = 60'000'000,
                                   int64_t mask_step_us = 60'000'000) {
  EngineBuildOptions b;
  b.model_dir = kModel;
  b.num_kv_blocks = 256;
  b.block_size = 16;
  b.show_progress = false;
  b.threads = 1;
  b.engine.grammar = service != nullptr ? nullptr : Compiler();
  b.engine.grammar_service = std::move(service);
  b.engine.grammar_mask_inline_us = mask_inline_us;
  b.engine.grammar_mask_step_us = mask_step_us;
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return std::move(built->engine);
}

struct Service : BlockableCompileService {
  explicit Service(int64_t budget_ms = 2000) : BlockableCompileService(Compiler(), budget_ms) {}
};

grammar::Constraint Regex(const std::string& value) {
  grammar::Constraint c;
  c.kind = grammar::Constraint::Kind::kRegex;
  c.value = value;
  return c;
}

EngineRequest Request(const std::string& id, int salt, const grammar::Constraint& c = {}) {
  EngineRequest r;
  r.id = id;
  r.prompt = {1};
  for (int i = 0; i < 12; ++i) r.prompt.push_back(3 + (salt * 31 + i * 17) % 500);
  r.params.max_tokens = 24;
  r.params.temperature = 0;
  r.params.constraint = c;
  r.tenant = "t";
  if (!c.active()) r.params.ignore_eos = true;
  return r;
}

struct Out {
  std::vector<int32_t> tokens;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  absl::Status status;
};
using Outs = std::map<std::string, Out>;

void Collect(const std::vector<SequenceUpdate>& updates, Outs* out) {
  for (const auto& u : updates) {
    Out& o = (*out)[u.request_id];
    o.tokens.insert(o.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
    if (u.finished) {
      o.finished = true;
      o.reason = u.finish_reason;
      o.status = u.status;
    }
  }
}

// Steps until nothing is left, waiting (as AsyncEngine sleeps) while requests wait off the loop.
void Drain(Engine& e, Outs* out) {
  for (int i = 0; i < 200000; ++i) {
    if (e.HasWork()) {
      Collect(e.Step(), out);
      continue;
    }
    const EngineStats s = e.stats();
    if (s.grammar_compile_waiting + s.grammar_mask_waiting == 0) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ADD_FAILURE() << "the engine never became idle";
}

// Steps while there is work without waiting for anything off the loop.
void StepWhileWork(Engine& e, Outs* out) {
  for (int i = 0; i < 1000 && e.HasWork(); ++i) Collect(e.Step(), out);
}

// What each request produces alone on an engine whose grammar is compiled and masks inline.
Out Solo(const EngineRequest& r) {
  auto e = MakeEngine(nullptr);
  EXPECT_TRUE(e->AddRequest(r).ok());
  Outs out;
  Drain(*e, &out);
  return out[r.id];
}

// A small regex, distinct per test (`k` dots at its end): every test compiles its own.
std::string Digits(int k) { return R"(\d{3}-[a-z]{2,6})" + std::string(k, '.'); }

TEST(EngineGrammarWaitTest, ACompilingRequestHoldsNothingWhileOthersStepThenRunsIdentically) {
  Service s;
  auto e = MakeEngine(s.service);
  s.Block();  // the compilation queues behind the blocker
  const EngineRequest constrained = Request("c", 1, Regex(Digits(11)));
  const EngineRequest plain = Request("p", 2);
  ASSERT_TRUE(e->AddRequest(constrained).ok());
  ASSERT_TRUE(e->AddRequest(plain).ok());
  Outs out;
  StepWhileWork(*e, &out);
  EXPECT_TRUE(out["p"].finished) << "the other request ran to its end meanwhile";
  EXPECT_TRUE(out["c"].tokens.empty());
  EngineStats st = e->stats();
  EXPECT_EQ(st.grammar_compile_waiting, 1);
  EXPECT_EQ(st.num_waiting, 1);
  EXPECT_EQ(st.kv_blocks_used, 0) << "a sequence waiting for its grammar holds no blocks";
  EXPECT_FALSE(e->HasWork());

  s.Unblock();
  Drain(*e, &out);
  EXPECT_TRUE(out["c"].finished);
  EXPECT_TRUE(out["c"].status.ok()) << out["c"].status;
  EXPECT_EQ(out["c"].tokens, Solo(constrained).tokens);
  EXPECT_EQ(out["p"].tokens, Solo(plain).tokens);
  st = e->stats();
  EXPECT_EQ(st.grammar_compiled, 1);
  EXPECT_EQ(st.grammar_cache_hits, 0);
  EXPECT_EQ(st.grammar_compile_waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST(EngineGrammarWaitTest, ACachedGrammarNeverWaits) {
  Service s;
  auto e = MakeEngine(s.service);
  Outs out;
  ASSERT_TRUE(e->AddRequest(Request("first", 1, Regex(Digits(12)))).ok());
  Drain(*e, &out);
  ASSERT_TRUE(out["first"].status.ok());
  EXPECT_EQ(e->stats().grammar_cache_hits, 0);
  EXPECT_EQ(e->stats().grammar_compiled, 1);
  s.Block();  // a compilation now could not run: the second request must not need one
  ASSERT_TRUE(e->AddRequest(Request("second", 3, Regex(Digits(12)))).ok());
  EXPECT_EQ(e->stats().grammar_compile_waiting, 0);
  EXPECT_EQ(e->stats().grammar_cache_hits, 1);
  StepWhileWork(*e, &out);
  EXPECT_TRUE(out["second"].finished);
  EXPECT_EQ(out["second"].tokens, Solo(Request("second", 3, Regex(Digits(12)))).tokens);
}

TEST(EngineGrammarWaitTest, AbortingDuringCompilationCancelsIt) {
  Service s;
  auto e = MakeEngine(s.service);
  s.Block();
  ASSERT_TRUE(e->AddRequest(Request("c", 1, Regex("[a-z]{1,30}"))).ok());
  Outs out;
  StepWhileWork(*e, &out);
  EXPECT_EQ(e->stats().grammar_compile_waiting, 1);
  e->AbortRequest("c");
  Collect(e->Step(), &out);
  EXPECT_TRUE(out["c"].finished);
  EXPECT_EQ(out["c"].reason, FinishReason::kAbort);
  const EngineStats st = e->stats();
  EXPECT_EQ(st.grammar_compile_waiting, 0);
  EXPECT_EQ(st.grammar_cancelled, 1);
  EXPECT_EQ(st.num_waiting, 0);
  EXPECT_EQ(s.service->stats().abandoned, 1) << "nobody waits for the queued compilation now";
  s.Unblock();
  EXPECT_EQ(s.service->stats().compiles, 0);
}

TEST(EngineGrammarWaitTest, AFailedCompilationEndsOnlyItsRequest) {
  Service s;
  auto e = MakeEngine(s.service);
  s.Block();  // so that the error comes from the worker, after a wait
  ASSERT_TRUE(e->AddRequest(Request("bad", 1, Regex("(a"))).ok());
  ASSERT_TRUE(e->AddRequest(Request("good", 2, Regex(Digits(4)))).ok());
  ASSERT_TRUE(e->AddRequest(Request("plain", 3)).ok());
  Outs out;
  StepWhileWork(*e, &out);
  EXPECT_EQ(e->stats().grammar_compile_waiting, 2);
  s.Unblock();
  Drain(*e, &out);
  EXPECT_EQ(out["bad"].reason, FinishReason::kError);
  EXPECT_EQ(out["bad"].status.code(), absl::StatusCode::kInvalidArgument) << out["bad"].status;
  EXPECT_TRUE(out["bad"].tokens.empty());
  EXPECT_TRUE(out["good"].status.ok()) << out["good"].status;
  EXPECT_TRUE(out["plain"].status.ok());
  EXPECT_EQ(e->stats().grammar_invalid, 1);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
}

TEST(EngineGrammarWaitTest, ACompilationPastItsBudgetEndsItsRequest) {
  Service s(/*budget_ms=*/5);
  auto e = MakeEngine(s.service);
  // Nested bounded repetitions: far more than 5 ms of CPU to compile and warm.
  ASSERT_TRUE(e->AddRequest(Request("big", 1, Regex("([a-z]{0,300}){0,300}x"))).ok());
  ASSERT_TRUE(e->AddRequest(Request("plain", 3)).ok());
  Outs out;
  Drain(*e, &out);
  EXPECT_EQ(out["big"].reason, FinishReason::kError);
  EXPECT_EQ(out["big"].status.code(), absl::StatusCode::kInvalidArgument) << out["big"].status;
  EXPECT_NE(out["big"].status.message().find("budget of 5 ms"), std::string::npos)
      << out["big"].status;
  EXPECT_TRUE(out["plain"].status.ok());
  EXPECT_EQ(e->stats().grammar_budget_exceeded, 1);
}

// Every uncached mask off the loop: the sequence waits with its slot and blocks while another
// keeps stepping, then continues with exactly the tokens it produces with masks inline.
TEST(EngineGrammarWaitTest, AMaskComputedOffTheLoopKeepsItsBlocksAndTheOutput) {
  Service s;
  auto e = MakeEngine(s.service, /*mask_inline_us=*/0);
  const EngineRequest constrained = Request("c", 4, Regex(Digits(16)));
  EngineRequest plain = Request("p", 5);
  plain.params.max_tokens = 200;
  Outs out;
  ASSERT_TRUE(e->AddRequest(constrained).ok());
  // Compiled (first mask included), then its first token sampled with the cached first mask.
  while (out["c"].tokens.empty()) {
    if (e->HasWork()) {
      Collect(e->Step(), &out);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  s.Block();  // the next state's mask must wait for the worker
  ASSERT_TRUE(e->AddRequest(plain).ok());
  StepWhileWork(*e, &out);
  EXPECT_TRUE(out["p"].finished) << "the other request kept stepping to its end";
  EngineStats st = e->stats();
  EXPECT_EQ(st.grammar_mask_waiting, 1);
  EXPECT_EQ(st.num_awaiting_kv, 0) << "a grammar wait is not a KV wait";
  EXPECT_GT(st.kv_blocks_used, 0) << "the waiting sequence keeps its blocks";
  EXPECT_EQ(out["c"].tokens.size(), 1u);
  s.Unblock();
  Drain(*e, &out);
  EXPECT_TRUE(out["c"].status.ok()) << out["c"].status;
  EXPECT_EQ(out["c"].tokens, Solo(constrained).tokens);
  st = e->stats();
  EXPECT_GT(st.grammar_masks_deferred, 1);
  EXPECT_EQ(st.grammar_mask_waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

// Two sequences on one grammar while a mask of it is computed off the loop: the other waits
// too (the computation holds the grammar's state graph); both end as they do alone.
TEST(EngineGrammarWaitTest, SequencesOfABusyGrammarWaitAndStayIdentical) {
  Service s;
  auto e = MakeEngine(s.service, /*mask_inline_us=*/0);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i)
    reqs.push_back(Request("c" + std::to_string(i), 10 + i, Regex(Digits(17))));
  for (const auto& r : reqs) ASSERT_TRUE(e->AddRequest(r).ok());
  Outs out;
  Drain(*e, &out);
  for (const auto& r : reqs) {
    EXPECT_TRUE(out[r.id].status.ok()) << out[r.id].status;
    EXPECT_EQ(out[r.id].tokens, Solo(r).tokens) << r.id;
  }
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
}

// A step's allowance for masks on the engine thread spent, the other sequences' masks are
// computed off the loop; each output is the same as alone.
TEST(EngineGrammarWaitTest, TheStepsMaskAllowanceSpentDefersTheRest) {
  Service s;
  auto e = MakeEngine(s.service, /*mask_inline_us=*/2000, /*mask_step_us=*/1);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    reqs.push_back(Request("c" + std::to_string(i), 20 + i, Regex(Digits(19 + i))));
  }
  for (const auto& r : reqs) ASSERT_TRUE(e->AddRequest(r).ok());
  Outs out;
  Drain(*e, &out);
  for (const auto& r : reqs) {
    EXPECT_TRUE(out[r.id].status.ok()) << out[r.id].status;
    EXPECT_EQ(out[r.id].tokens, Solo(r).tokens) << r.id;
  }
  EXPECT_GT(e->stats().grammar_masks_deferred, 0);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
}

// Aborting a sequence whose mask is being computed off the loop ends it and frees its blocks.
TEST(EngineGrammarWaitTest, AbortingDuringAMaskFreesItsBlocks) {
  Service s;
  auto e = MakeEngine(s.service, /*mask_inline_us=*/0);
  Outs out;
  ASSERT_TRUE(e->AddRequest(Request("c", 4, Regex(Digits(18)))).ok());
  while (out["c"].tokens.empty()) {
    if (e->HasWork()) {
      Collect(e->Step(), &out);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  s.Block();
  StepWhileWork(*e, &out);
  ASSERT_EQ(e->stats().grammar_mask_waiting, 1);
  e->AbortRequest("c");
  Collect(e->Step(), &out);
  EXPECT_EQ(out["c"].reason, FinishReason::kAbort);
  EXPECT_EQ(e->stats().grammar_mask_waiting, 0);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  s.Unblock();
  EXPECT_EQ(s.service->stats().tasks, 1) << "the blocker ran; the abandoned mask did not";
}

}  // namespace
}  // namespace tandem
