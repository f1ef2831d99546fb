// Device selection in BuildEngine (runs with or without a GPU) and the engine on the CUDA
// backend: greedy generation of the bundled model equals its reference ids, alone and batched.

#include <map>

#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::gpu_testing {
namespace {

TEST(CudaEngineTest, DeviceNamesAreValidated) {
  EXPECT_EQ(ResolveDevice("cpu").value(), "cpu");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CUDA", ""}) {
    auto d = ResolveDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CudaEngineTest, AutoPicksCudaOnlyWithAGpu) {
  std::string why;
  const bool gpu = CudaDeviceAvailable(&why);
  auto d = ResolveDevice("auto");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, gpu ? "cuda:0" : "cpu") << why;
  if (gpu) {
    EXPECT_EQ(ResolveDevice("cuda:1").value(), "cuda:1");
  }
}

TEST(CudaEngineTest, CudaWithoutGpuIsAClearError) {
  std::string why;
  if (CudaDeviceAvailable(&why)) GTEST_SKIP() << "a GPU is visible";
  EngineBuildOptions options;
  options.model_dir = ::tandem::testing::ModelDir("stories260k");
  options.device = "cuda";
  options.show_progress = false;
  auto built = BuildEngine(options);
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(built.status().message().find("device 'cuda' requested but"), std::string::npos)
      << built.status();
  EXPECT_NE(built.status().message().find(why), std::string::npos) << built.status();
}

TEST(CudaEngineTest, GreedyGenerationMatchesReference) {
  TANDEM_REQUIRE_GPU();
  const auto ref = ::tandem::testing::LoadReference("stories260k");
  EngineBuildOptions options;
  options.model_dir = ::tandem::testing::ModelDir("stories260k");
  options.device = "cuda";
  options.weight_dtype = "f32";
  options.num_kv_blocks = 256;
  options.show_progress = false;
  auto built = BuildEngine(options);
  ASSERT_TRUE(built.ok()) << built.status();
  Engine& engine = *built->engine;
  const std::vector<int32_t> prompt(ref.sequence.begin(), ref.sequence.begin() + ref.prompt_len);
  const std::vector<int32_t> want(ref.sequence.begin() + ref.prompt_len, ref.sequence.end());
  for (int copies : {1, 8}) {
    for (int i = 0; i < copies; ++i) {
      EngineRequest r;
      r.id = std::to_string(copies) + "/" + std::to_string(i);
      r.prompt = prompt;
      r.params.max_tokens = static_cast<int32_t>(want.size());
      r.params.ignore_eos = true;
      r.params.temperature = 0;
      ASSERT_TRUE(engine.AddRequest(r).ok());
    }
    std::map<std::string, std::vector<int32_t>> out;
    while (engine.HasWork()) {
      for (const SequenceUpdate& u : engine.Step()) {
        ASSERT_TRUE(u.status.ok()) << u.status;
        auto& v = out[u.request_id];
        v.insert(v.end(), u.new_tokens.begin(), u.new_tokens.end());
      }
    }
    ASSERT_EQ(out.size(), static_cast<size_t>(copies));
    for (const auto& [id, tokens] : out) EXPECT_EQ(tokens, want) << id;
  }
}

// The engine builder hands --kv-cache-memory and --matmul-input-dtype to the CUDA backend: the
// pool holds the budget's blocks (refused, naming both memory flags, above
// --gpu-memory-utilization's share), auto gives bf16 activations for bf16 weights and f32 the
// parity mode.
TEST(CudaEngineTest, MemoryFlagsAndActivationModeReachTheBackend) {
  TANDEM_REQUIRE_GPU();
  EngineBuildOptions options;
  options.model_dir = ::tandem::testing::ModelDir("stories260k");
  options.device = "cuda";
  options.weight_dtype = "bf16";
  options.kv_cache_bytes = int64_t{64} << 20;
  options.show_progress = false;
  for (const char* inputs : {"auto", "bf16", "f32"}) {
    options.matmul_input_dtype = inputs;
    auto built = BuildEngine(options);
    ASSERT_TRUE(built.ok()) << built.status();
    auto* cuda = dynamic_cast<cuda::CudaBackend*>(&built->engine->backend());
    ASSERT_NE(cuda, nullptr);
    EXPECT_EQ(cuda->kv_spec().num_blocks,
              (int64_t{64} << 20) / static_cast<int64_t>(cuda->kv_spec().bytes_per_block()));
    EXPECT_EQ(cuda->bf16_activations(), std::string(inputs) != "f32") << inputs;
  }
  options.matmul_input_dtype = "int8";
  EXPECT_FALSE(BuildEngine(options).ok());
  options.matmul_input_dtype = "auto";
  options.gpu_memory_utilization = 0.05;
  options.kv_cache_bytes = int64_t{1} << 40;
  auto refused = BuildEngine(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--kv-cache-memory"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("--gpu-memory-utilization"), std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace tandem::gpu_testing
