// Overlapped steps (EngineOptions::async_scheduling, common/engine/README.md "Overlapped steps")
// on the emulated CUDA backend with deferred streams: the emulator runs a stream's work only when
// the host waits for it (cudaEventSynchronize / cudaStreamSynchronize), so a loop that read a
// step's tokens before waiting, or staged the next step over buffers the device has not read,
// would produce other tokens. Every test runs the same requests with overlap on and off and
// expects the same updates (tokens, logprobs, endings), and that the steps really overlapped.

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda/emulation/fake_cuda.h"
#include "common/engine/backend/cpu/cpu_backend.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/engine/spec/ngram_proposer.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem {
namespace {

using ::tandem::testing::Load;
using ::tandem::testing::LoadReference;

struct Output {
  std::vector<int32_t> tokens;
  std::vector<int32_t> logprob_ids;
  FinishReason finish = FinishReason::kNone;
  bool ok = true;
};
using Outputs = std::map<std::string, Output>;

struct Result {
  Outputs outputs;
  EngineStats stats;
  int64_t overlapped_launches = 0;
  int64_t device_input_tokens = 0;
  int64_t overlapped_waits = 0;  // the emulator's event waits with later work enqueued
};

// How a run is set up, and what its caller does between steps (as a stop-string matcher or a
// client would).
struct RunSetup {
  // Ends sample 0 of `id` (kStop) once its output ends with these tokens (a "stop string").
  std::map<std::string, std::vector<int32_t>> stop;
  // Aborts `id` once it has this many tokens.
  std::map<std::string, size_t> abort_after;
  int64_t num_blocks = 64;
  bool cpu = false;      // the CPU backend instead of the emulated CUDA one
  bool grammar = false;  // structured output available
  bool ngram = false;    // speculative decoding (n-gram proposer)
};

std::vector<int32_t> Prompt(int offset, int len) {
  const auto ref = LoadReference("stories260k");
  std::vector<int32_t> p(ref.sequence.begin(), ref.sequence.begin() + ref.prompt_len);
  for (int i = 0; i < offset; ++i) p.push_back(ref.sequence[ref.prompt_len + i]);
  p.resize(std::min<size_t>(p.size(), len));
  return p;
}

EngineRequest Greedy(const std::string& id, int offset, int32_t max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt = Prompt(offset, 64);
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

Result Generate(bool async, std::vector<EngineRequest> requests, const RunSetup& setup = {}) {
  const int64_t num_blocks = setup.num_blocks;
  const bool cpu = setup.cpu;
  const RunSetup& caller = setup;
  cuda_emu::SetDeferredStreams(true);
  Result run;
  auto model = Load("stories260k", DType::kF32);
  std::unique_ptr<Backend> backend;
  cuda::CudaBackend* cuda = nullptr;
  if (cpu) {
    CpuBackendOptions options;
    options.num_blocks = num_blocks;
    options.kv_dtype = DType::kF32;
    auto b = CpuBackend::Create(model, options);
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return run;
    backend = std::move(b).value();
  } else {
    CudaBackendOptions options;
    options.num_blocks = num_blocks;
    options.kv_dtype = DType::kF32;
    options.max_num_tokens = 256;
    options.max_num_seqs = 16;
    options.max_graph_tokens = 16;
    auto b = cuda::CudaBackend::Create(model, options);
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return run;
    cuda = b->get();
    backend = std::move(b).value();
  }
  EngineOptions engine_options;
  engine_options.async_scheduling = async;
  engine_options.scheduler.max_num_batched_tokens = 256;
  engine_options.scheduler.max_num_seqs = 16;
  if (setup.grammar) {
    auto grammar = LoadGrammarCompiler(testing::ModelDir("stories260k"));
    EXPECT_TRUE(grammar.ok()) << grammar.status();
    if (!grammar.ok()) return run;
    engine_options.grammar = std::move(grammar).value();
  }
  std::unique_ptr<Proposer> proposer;
  if (setup.ngram) {
    engine_options.spec.method = SpecOptions::Method::kNgram;
    engine_options.spec.num_speculative_tokens = 3;
    proposer = std::make_unique<NgramProposer>(4, 1);
  }
  auto engine = Engine::Create(engine_options, model, std::move(backend), std::move(proposer));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  for (const EngineRequest& r : requests) EXPECT_TRUE((*engine)->AddRequest(r).ok()) << r.id;
  const int64_t waits_before = cuda_emu::EventWaitsWithLaterWork();
  int guard = 0;
  // Work to step, or a constrained request waiting for its grammar off the engine loop.
  auto busy = [&] {
    if ((*engine)->HasWork()) return true;
    const EngineStats st = (*engine)->stats();
    if (st.grammar_compile_waiting + st.grammar_mask_waiting == 0) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    return true;
  };
  while (busy() && ++guard < 100000) {
    std::vector<std::pair<std::string, int32_t>> to_finish;
    std::vector<std::string> to_abort;
    for (const SequenceUpdate& u : (*engine)->Step()) {
      Output& o = run.outputs[u.request_id + "/" + std::to_string(u.index)];
      o.tokens.insert(o.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      for (const TokenLogprobs& lp : u.logprobs) o.logprob_ids.push_back(lp.chosen.id);
      if (!u.status.ok()) o.ok = false;
      if (u.finished) o.finish = u.finish_reason;
      if (u.finished) continue;
      if (auto it = caller.stop.find(u.request_id); it != caller.stop.end()) {
        const std::vector<int32_t>& s = it->second;
        if (o.tokens.size() >= s.size() &&
            std::equal(s.begin(), s.end(), o.tokens.end() - s.size())) {
          to_finish.push_back({u.request_id, u.index});
        }
      }
      if (auto it = caller.abort_after.find(u.request_id);
          it != caller.abort_after.end() && o.tokens.size() >= it->second) {
        to_abort.push_back(u.request_id);
      }
    }
    for (const auto& [id, index] : to_finish) {
      (*engine)->FinishSequence(id, index, FinishReason::kStop);
    }
    for (const std::string& id : to_abort) (*engine)->AbortRequest(id);
  }
  run.stats = (*engine)->stats();
  EXPECT_EQ(run.stats.kv_blocks_used, 0);
  EXPECT_EQ(run.stats.num_running + run.stats.num_waiting, 0);
  if (cuda != nullptr) {
    run.overlapped_launches = cuda->overlapped_launches();
    run.device_input_tokens = cuda->device_input_tokens();
  }
  run.overlapped_waits = cuda_emu::EventWaitsWithLaterWork() - waits_before;
  return run;
}

void ExpectSameOutputs(const Outputs& got, const Outputs& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, w] : want) {
    ASSERT_TRUE(got.count(id)) << id;
    const Output& g = got.at(id);
    EXPECT_EQ(g.tokens, w.tokens) << id;
    EXPECT_EQ(g.logprob_ids, w.logprob_ids) << id;
    EXPECT_EQ(g.finish, w.finish) << id;
    EXPECT_EQ(g.ok, w.ok) << id;
  }
}

// Greedy requests of different lengths finishing mid-batch (max_tokens), one stopping on a stop
// token id, one with logprobs, one seeded sampled one: overlapped steps give the synchronous
// loop's updates, the steps overlapped (the next step launched before this one's event was
// waited, its input tokens gathered on the device), and greedy tokens are the CPU backend's.
TEST(CudaEngineOverlapTest, OverlappedStepsGiveTheSynchronousOutputs) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(Greedy("g" + std::to_string(i), i, 6 + 5 * i));
  const Result probe = Generate(false, {Greedy("probe", 0, 12)});
  const std::vector<int32_t>& probe_tokens = probe.outputs.at("probe/0").tokens;
  ASSERT_EQ(probe_tokens.size(), 12u);
  EngineRequest stop = Greedy("stop-id", 0, 30);
  stop.params.stop_token_ids = {probe_tokens[7]};
  reqs.push_back(stop);
  EngineRequest lp = Greedy("logprobs", 2, 14);
  lp.params.logprobs = 2;
  reqs.push_back(lp);
  EngineRequest sampled = Greedy("sampled", 1, 17);
  sampled.params.temperature = 0.9f;
  sampled.params.top_p = 0.9f;
  sampled.params.seed = 5;
  reqs.push_back(sampled);

  const Result sync = Generate(false, reqs);
  const Result overlap = Generate(true, reqs);
  ExpectSameOutputs(overlap.outputs, sync.outputs);
  EXPECT_EQ(sync.outputs.at("stop-id/0").finish, FinishReason::kStop);
  EXPECT_LT(sync.outputs.at("stop-id/0").tokens.size(), 30u);
  EXPECT_EQ(sync.stats.overlapped_steps, 0);
  EXPECT_EQ(sync.overlapped_launches, 0);
  EXPECT_GT(overlap.stats.overlapped_steps, 20);
  EXPECT_GT(overlap.overlapped_launches, 20);
  EXPECT_GT(overlap.device_input_tokens, 20);
  EXPECT_GT(overlap.overlapped_waits, 20);
  EXPECT_EQ(overlap.stats.generated_tokens, sync.stats.generated_tokens);

  std::vector<EngineRequest> greedy(reqs.begin(), reqs.begin() + 6);
  RunSetup on_cpu;
  on_cpu.cpu = true;
  const Result cpu = Generate(false, greedy, on_cpu);
  for (const auto& [id, out] : cpu.outputs) {
    EXPECT_EQ(overlap.outputs.at(id).tokens, out.tokens) << id;
  }
}

// The caller ends requests on the tokens it has seen: a stop string matched between steps
// (FinishSequence) and a cancellation (AbortRequest) while the next step is in flight drop that
// step's token for them, so they end exactly as in the synchronous loop.
TEST(CudaEngineOverlapTest, StopStringsAndCancellationEndOnTheSeenTokens) {
  const Result probe = Generate(false, {Greedy("a", 0, 20)});
  const std::vector<int32_t>& t = probe.outputs.at("a/0").tokens;
  RunSetup caller;
  caller.stop["a"] = {t[5], t[6]};
  caller.abort_after["b"] = 7;
  std::vector<EngineRequest> reqs = {Greedy("a", 0, 20), Greedy("b", 1, 20), Greedy("c", 2, 20)};
  const Result sync = Generate(false, reqs, caller);
  const Result overlap = Generate(true, reqs, caller);
  ExpectSameOutputs(overlap.outputs, sync.outputs);
  EXPECT_EQ(sync.outputs.at("a/0").tokens.size(), 7u);
  EXPECT_EQ(sync.outputs.at("b/0").finish, FinishReason::kAbort);
  EXPECT_EQ(sync.outputs.at("b/0").tokens.size(), 7u);
  EXPECT_EQ(sync.outputs.at("c/0").tokens.size(), 20u);
  EXPECT_GT(overlap.overlapped_launches, 5);
}

// A pool too small for every request at once: sequences are preempted (some while their token
// is still on the device) and recomputed; outputs equal the synchronous loop's.
TEST(CudaEngineOverlapTest, PreemptionUnderOverlap) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(Greedy("p" + std::to_string(i), i, 24));
  RunSetup small;
  small.num_blocks = 6;
  const Result sync = Generate(false, reqs, small);
  const Result overlap = Generate(true, reqs, small);
  EXPECT_GT(sync.stats.preemptions, 0);
  EXPECT_GT(overlap.stats.preemptions, 0);
  ExpectSameOutputs(overlap.outputs, sync.outputs);
  EXPECT_GT(overlap.overlapped_launches, 10);
}

// Requests whose next plan needs their token on the host (penalties counting it, n = 2 whose
// first token forks on the host) fall back to the synchronous loop for the steps they sample in,
// beside requests that overlap; outputs equal the synchronous loop's.
TEST(CudaEngineOverlapTest, HostDependentRequestsFallBackPerStep) {
  std::vector<EngineRequest> reqs = {Greedy("plain", 0, 24)};
  EngineRequest pen = Greedy("penalties", 1, 12);
  pen.params.repetition_penalty = 1.3f;
  pen.params.frequency_penalty = 0.5f;
  reqs.push_back(pen);
  EngineRequest n2 = Greedy("n2", 2, 10);
  n2.params.temperature = 0.8f;
  n2.params.seed = 9;
  n2.n = 2;
  reqs.push_back(n2);
  const Result sync = Generate(false, reqs);
  const Result overlap = Generate(true, reqs);
  ExpectSameOutputs(overlap.outputs, sync.outputs);
  // The steps after the penalised request ended overlap again.
  EXPECT_GT(overlap.stats.overlapped_steps, 5);
  EXPECT_LT(overlap.stats.overlapped_steps, overlap.stats.steps - 10);
}

// A JSON-schema-constrained request (its masks follow its tokens on the host) beside plain ones:
// the steps it samples in wait for their tokens; once it has ended the others overlap again.
TEST(CudaEngineOverlapTest, GrammarFallsBackPerStep) {
  EngineRequest json = Greedy("json", 0, 12);
  json.params.constraint.kind = grammar::Constraint::Kind::kJsonSchema;
  json.params.constraint.value =
      R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})";
  std::vector<EngineRequest> reqs = {json, Greedy("plain", 1, 30), Greedy("plain2", 2, 24)};
  RunSetup with_grammar;
  with_grammar.grammar = true;
  const Result sync = Generate(false, reqs, with_grammar);
  const Result overlap = Generate(true, reqs, with_grammar);
  ExpectSameOutputs(overlap.outputs, sync.outputs);
  EXPECT_GT(overlap.stats.overlapped_steps, 5);
  // Every step the constrained request sampled in was collected at once.
  EXPECT_LE(overlap.stats.overlapped_steps,
            overlap.stats.steps - static_cast<int64_t>(sync.outputs.at("json/0").tokens.size()));
}

// Speculative decoding (its drafts come from the tokens on the host) keeps the synchronous loop
// for every step; greedy output is the plain loop's.
TEST(CudaEngineOverlapTest, SpeculationRunsSynchronously) {
  std::vector<EngineRequest> reqs = {Greedy("s0", 0, 20), Greedy("s1", 3, 16)};
  RunSetup spec;
  spec.ngram = true;
  const Result plain = Generate(false, reqs);
  const Result speculating = Generate(true, reqs, spec);
  EXPECT_EQ(speculating.stats.overlapped_steps, 0);
  EXPECT_EQ(speculating.overlapped_launches, 0);
  ExpectSameOutputs(speculating.outputs, plain.outputs);
}

}  // namespace
}  // namespace tandem
