// The engine on the bundled stories260k model: continuous batching, chunked prefill, prefix
// caching, preemption and n > 1 copy-on-write all give the same greedy tokens as a request run
// alone, and every block returns to the pool.

#include "common/engine/engine.h"

#include <map>
#include <random>

#include "common/engine/engine_builder.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using testing_util::MakeRequests;
using testing_util::Req;
using testing_util::RunAll;

std::unique_ptr<Engine> MakeEngine(EngineOptions options, int64_t num_blocks,
                                   const std::string& quantization = "none",
                                   const std::string& kv_dtype = "auto",
                                   const std::string& matmul_input = "auto") {
  EngineBuildOptions b;
  b.quantization = quantization;
  b.matmul_input_dtype = matmul_input;
  b.kv_cache_dtype = kv_dtype;
  b.quant_group_size = 32;
  b.model_dir = tandem::TestSourceDir() + "/models/stories260k";
  b.num_kv_blocks = num_blocks;
  b.show_progress = false;
  b.threads = 1;
  b.engine = options;
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return std::move(built->engine);
}

TEST(EngineTest, BatchingChunkingAndCachingDoNotChangeGreedyOutput) {
  std::vector<Req> reqs = MakeRequests(24, 5, 70, 40);
  // Reference: each request alone, prompt in one step, no prefix cache.
  std::map<std::string, std::vector<int32_t>> solo;
  {
    EngineOptions o;
    o.enable_prefix_cache = false;
    o.scheduler.max_num_seqs = 1;
    o.scheduler.max_num_batched_tokens = 512;
    auto engine = MakeEngine(o, 256);
    solo = RunAll(*engine, reqs);
  }
  struct Variant {
    int64_t seqs, tokens, chunk, blocks;
    bool cache;
  };
  for (const Variant& v : {Variant{24, 512, 0, 256, true}, Variant{8, 17, 0, 256, true},
                           Variant{24, 64, 5, 256, false}, Variant{24, 300, 0, 12, true}}) {
    EngineOptions o;
    o.enable_prefix_cache = v.cache;
    o.scheduler.max_num_seqs = v.seqs;
    o.scheduler.max_num_batched_tokens = v.tokens;
    o.scheduler.max_prefill_chunk = v.chunk;
    auto engine = MakeEngine(o, v.blocks);
    // Twice: the second pass runs on a warm prefix cache.
    for (int pass = 0; pass < 2; ++pass) {
      auto got = RunAll(*engine, reqs);
      EXPECT_EQ(got, solo) << "seqs " << v.seqs << " tokens " << v.tokens << " blocks " << v.blocks
                           << " pass " << pass;
      EngineStats s = engine->stats();
      EXPECT_EQ(s.kv_blocks_used, 0);
      EXPECT_EQ(s.num_running + s.num_waiting, 0);
      if (v.blocks == 12) {
        EXPECT_GT(s.preemptions, 0) << "the small pool forces preemption";
      }
    }
  }
}

// Within each weight format and KV dtype, batching, chunking, prefix caching and
// preemption leave greedy output unchanged, through the same options the flags set.
TEST(EngineTest, QuantizedWeightsAndKvKeepGreedyOutputInvariant) {
  std::vector<Req> reqs = MakeRequests(16, 7, 70, 40);
  struct Format {
    const char* quant;
    const char* kv;
    const char* inputs = "auto";  // matmul inputs
  };
  std::vector<std::map<std::string, std::vector<int32_t>>> outputs;
  for (const Format& f : {Format{"int8", "fp8"}, Format{"int4", "int8"}, Format{"none", "fp8"},
                          Format{"int4", "auto", "int8"}, Format{"int8", "auto", "bf16"}}) {
    EngineOptions solo_options;
    solo_options.enable_prefix_cache = false;
    solo_options.scheduler.max_num_seqs = 1;
    auto solo_engine = MakeEngine(solo_options, 256, f.quant, f.kv, f.inputs);
    ASSERT_NE(solo_engine, nullptr);
    const auto solo = RunAll(*solo_engine, reqs);
    outputs.push_back(solo);
    for (int64_t blocks : {int64_t{256}, int64_t{12}}) {
      EngineOptions o;
      o.scheduler.max_num_seqs = 16;
      o.scheduler.max_num_batched_tokens = 64;
      o.scheduler.max_prefill_chunk = 5;
      auto engine = MakeEngine(o, blocks, f.quant, f.kv, f.inputs);
      for (int pass = 0; pass < 2; ++pass) {
        EXPECT_EQ(RunAll(*engine, reqs), solo)
            << f.quant << " kv " << f.kv << " inputs " << f.inputs << " blocks " << blocks
            << " pass " << pass;
      }
      EXPECT_EQ(engine->stats().kv_blocks_used, 0);
      if (blocks == 12) {
        EXPECT_GT(engine->stats().preemptions, 0);
      }
    }
  }
  // The options are honoured: int4 weights change some greedy tokens against int8.
  EXPECT_NE(outputs[0], outputs[1]);
}

TEST(EngineTest, UnknownQuantizationOrKvDtypeIsAnError) {
  EngineBuildOptions b;
  b.model_dir = tandem::TestSourceDir() + "/models/stories260k";
  b.show_progress = false;
  b.quantization = "int3";
  EXPECT_NE(BuildEngine(b).status().message().find("quantization"), std::string::npos);
  b.quantization = "int8";
  b.kv_cache_dtype = "fp4";
  EXPECT_NE(BuildEngine(b).status().message().find("kv cache dtype"), std::string::npos);
  b.kv_cache_dtype = "auto";
  b.matmul_input_dtype = "int4";
  EXPECT_NE(BuildEngine(b).status().message().find("matmul input dtype must be"),
            std::string::npos);
  // int8 inputs are for quantized weights only.
  b.quantization = "none";
  b.matmul_input_dtype = "int8";
  const absl::Status st = BuildEngine(b).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("int8 inputs int8 or int4 weights"), std::string::npos) << st;
}

TEST(EngineTest, SamplesShareThePromptCopyOnWrite) {
  std::vector<Req> reqs = {{{1,   403, 407, 261, 378, 300, 301, 302, 303, 304,
                             305, 306, 307, 308, 309, 310, 311, 312, 313, 314},
                            30}};
  EngineOptions o;
  auto engine = MakeEngine(o, 64);
  auto many = RunAll(*engine, reqs, /*n=*/4, /*temperature=*/1.0f);
  ASSERT_EQ(many.size(), 4u);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  // Each sample equals the same request run with n = 1 and the sample's seed (seed + index),
  // which proves a sample's KV was never disturbed by its siblings' writes.
  for (int i = 0; i < 4; ++i) {
    EngineRequest r;
    r.id = "single" + std::to_string(i);
    r.prompt = reqs[0].prompt;
    r.params.max_tokens = 30;
    r.params.ignore_eos = true;
    r.params.temperature = 1.0f;
    r.params.seed = 100 + i;
    ASSERT_TRUE(engine->AddRequest(r).ok());
    std::vector<int32_t> tokens;
    while (engine->HasWork()) {
      for (const auto& u : engine->Step())
        tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    EXPECT_EQ(tokens, many["0/" + std::to_string(i)]) << "sample " << i;
  }
}

TEST(EngineTest, AbortFreesBlocksImmediately) {
  EngineOptions o;
  auto engine = MakeEngine(o, 64);
  EngineRequest r;
  r.id = "a";
  r.prompt = {1, 403, 407, 261, 378};
  r.params.max_tokens = 100;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  engine->Step();
  engine->Step();
  EXPECT_GT(engine->stats().kv_blocks_used, 0);
  engine->AbortRequest("a");
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  auto updates = engine->Step();
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_TRUE(updates[0].finished);
  EXPECT_EQ(updates[0].finish_reason, FinishReason::kAbort);
  EXPECT_FALSE(engine->HasWork());
}

TEST(EngineTest, RejectsBadRequestsNamingTheField) {
  EngineOptions o;
  auto engine = MakeEngine(o, 8);
  EngineRequest r;
  r.id = "x";
  EXPECT_NE(engine->AddRequest(r).message().find("prompt"), std::string::npos);
  r.prompt = {1, 600};
  EXPECT_NE(engine->AddRequest(r).message().find("token id 600"), std::string::npos);
  r.prompt = {1, 2};
  r.params.max_tokens = 1000;
  EXPECT_NE(engine->AddRequest(r).message().find("max_tokens"), std::string::npos);
  r.params.max_tokens = 200;  // fits the context, not the 8-block pool
  absl::Status st = engine->AddRequest(r);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  r.params.max_tokens = 10;
  r.n = 0;
  EXPECT_NE(engine->AddRequest(r).message().find("n:"), std::string::npos);
}

// Regression (found by async_engine_test): a request with n > 1 aborted or finished
// before its prompt was computed (its samples not forked yet) used to end only sample 0, so its
// caller waited forever for the other n - 1 endings.
TEST(EngineTest, EndingARequestBeforeItForksEndsEverySample) {
  for (int how = 0; how < 2; ++how) {
    auto engine = MakeEngine(EngineOptions{}, 16);
    EngineRequest r;
    r.id = "fork";
    r.prompt = {1, 10, 20, 30, 40};
    r.params.max_tokens = 8;
    r.n = 3;
    ASSERT_TRUE(engine->AddRequest(r).ok());
    if (how == 0) {
      engine->AbortRequest("fork");
    } else {
      engine->FinishSequence("fork", 0, FinishReason::kStop);
    }
    std::map<int32_t, int> endings;
    for (int steps = 0; steps < 100 && engine->HasWork(); ++steps) {
      for (const SequenceUpdate& u : engine->Step()) endings[u.index] += u.finished;
    }
    for (const SequenceUpdate& u : engine->Step()) endings[u.index] += u.finished;
    EXPECT_EQ(endings, (std::map<int32_t, int>{{0, 1}, {1, 1}, {2, 1}})) << "how " << how;
    EXPECT_EQ(engine->stats().kv_blocks_used, 0);
    EXPECT_FALSE(engine->HasWork());
  }
}

}  // namespace
}  // namespace tandem
