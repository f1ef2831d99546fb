// The engine serving AWQ / GPTQ int4 checkpoints (packed from llama2xs-280k by the test packer)
// through the same build options the flags set: continuous batching, chunked prefill, prefix
// caching and preemption give the same greedy tokens as each request alone, and asking for
// load-time quantization of an already quantized checkpoint is a clear error.

#include <map>
#include <random>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/engine/engine_test_util.h"
#include "tests/unit/common/engine/model/int4_checkpoint_util.h"

namespace tandem {
namespace {

using testing_util::MakeRequests;
using testing_util::Req;
using testing_util::RunAll;

EngineBuildOptions BuildOptions(const std::string& dir, EngineOptions options, int64_t blocks) {
  EngineBuildOptions b;
  b.model_dir = dir;
  b.num_kv_blocks = blocks;
  b.show_progress = false;
  b.threads = 1;
  b.engine = options;
  return b;
}

TEST(EngineInt4CheckpointTest, GreedyOutputInvariantUnderBatchingChunkingCachingPreemption) {
  const std::vector<Req> reqs = MakeRequests(12, 3, 60, 30);
  std::vector<std::map<std::string, std::vector<int32_t>>> per_format;
  const std::pair<const char*, const char*> formats[] = {
      {"engine_awq", "--format awq --group 32"},
      {"engine_gptq_act", "--format gptq --group 32 --act-order"}};
  for (const auto& [name, args] : formats) {
    const auto packed = testing_util::PackInt4Checkpoint("llama2xs-280k", args, name);
    EngineOptions solo_options;
    solo_options.enable_prefix_cache = false;
    solo_options.scheduler.max_num_seqs = 1;
    auto solo_built = BuildEngine(BuildOptions(packed.quantized, solo_options, 256));
    ASSERT_TRUE(solo_built.ok()) << solo_built.status();
    EXPECT_EQ(solo_built->model->quantization(), WeightQuant::kInt4);
    const auto solo = RunAll(*solo_built->engine, reqs);
    per_format.push_back(solo);
    for (int64_t blocks : {int64_t{256}, int64_t{10}}) {
      EngineOptions o;
      o.scheduler.max_num_seqs = 12;
      o.scheduler.max_num_batched_tokens = 64;
      o.scheduler.max_prefill_chunk = 5;
      auto built = BuildEngine(BuildOptions(packed.quantized, o, blocks));
      ASSERT_TRUE(built.ok()) << built.status();
      for (int pass = 0; pass < 2; ++pass) {  // the second pass hits the prefix cache
        EXPECT_EQ(RunAll(*built->engine, reqs), solo)
            << args << " blocks " << blocks << " pass " << pass;
      }
      EXPECT_EQ(built->engine->stats().kv_blocks_used, 0);
      if (blocks == 10) {
        EXPECT_GT(built->engine->stats().preemptions, 0);
      }
    }
  }
  EXPECT_NE(per_format[0], per_format[1]) << "the two checkpoints hold different weights";
}

TEST(EngineInt4CheckpointTest, LoadTimeQuantizationOfAQuantizedCheckpointIsAnError) {
  const auto packed =
      testing_util::PackInt4Checkpoint("llama2xs-280k", "--format gptq --group 64", "engine_err");
  EngineBuildOptions b = BuildOptions(packed.quantized, EngineOptions(), 64);
  b.quantization = "int4";
  auto built = BuildEngine(b);
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.status().message().find("is already quantized (gptq int4"), std::string::npos)
      << built.status();
}

}  // namespace
}  // namespace tandem
