// Multi-LoRA through the engine on the emulated CUDA backend, whose adapters live in device
// slots reserved when the backend is made (device_lora.h): with fewer slots than adapters in
// use over time, requests of three adapters and the base model, with at most --max-loras
// adapters in a batch, give the same greedy tokens as each request alone, adapters moving
// between slots; an engine whose registry may run more adapters at once than the backend
// reserved slots for is refused when it is made, not at a step.

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/engine.h"
#include "common/engine/lora/lora_registry.h"
#include "common/engine/lora/lora_writer.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

class CudaEngineLoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::path(::testing::TempDir()) /
             (std::string("cuda_engine_lora_") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(root_);
    auto config = LoadModelConfig(testing::ModelDir("stories260k") + "/config.json");
    ASSERT_TRUE(config.ok());
    config_ = *config;
    for (int i = 1; i <= 3; ++i) {
      RandomLoraOptions o;
      o.seed = 40 + i;
      o.rank = 8;
      o.alpha = 16;
      o.std = 0.08;
      ASSERT_TRUE(WriteRandomLoraAdapter(config_, o, Dir(i)).ok());
    }
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string Dir(int i) const { return absl::StrCat(root_, "/a", i); }

  // An engine on an emulated CUDA backend with `slots` LoRA slots (rank 8, f32) serving a1..a3
  // with --max-loras `max_loras`.
  absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(int64_t slots, int64_t max_loras) {
    std::shared_ptr<const Model> model = testing::Load("stories260k", DType::kF32);
    CudaBackendOptions options;
    options.num_blocks = 128;
    options.kv_dtype = DType::kF32;
    options.max_num_tokens = 256;
    options.max_num_seqs = 16;
    options.max_graph_tokens = 16;
    options.lora_slots = slots;
    options.lora_max_rank = 8;
    options.lora_dtype = DType::kF32;
    auto backend = cuda::CudaBackend::Create(model, options);
    if (!backend.ok()) return backend.status();
    backend_ = backend->get();
    LoraOptions lora;
    lora.max_loras = max_loras;
    lora.max_lora_rank = 8;
    lora.max_cpu_loras = 3;
    lora.model_dtype = DType::kF32;
    lora.modules = {"a1=" + Dir(1), "a2=" + Dir(2), "a3=" + Dir(3)};
    auto registry = MakeLoraRegistry(config_, lora);
    if (!registry.ok()) return registry.status();
    EngineOptions engine_options;
    engine_options.scheduler.max_num_batched_tokens = 256;
    engine_options.scheduler.max_num_seqs = 16;
    engine_options.lora = *registry;
    return Engine::Create(engine_options, model, *std::move(backend));
  }

  std::string root_;
  ModelConfig config_;
  cuda::CudaBackend* backend_ = nullptr;  // the last engine's
};

struct Job {
  std::string id, lora;
  std::vector<int32_t> prompt;
};

std::map<std::string, std::vector<int32_t>> RunJobs(Engine& engine, const std::vector<Job>& jobs) {
  for (const Job& j : jobs) {
    EngineRequest r;
    r.id = j.id;
    r.prompt = j.prompt;
    r.lora_name = j.lora;
    r.params.max_tokens = 10;
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    EXPECT_TRUE(engine.AddRequest(r).ok());
  }
  std::map<std::string, std::vector<int32_t>> out;
  int guard = 0;
  while (engine.HasWork() && ++guard < 10000) {
    for (const SequenceUpdate& u : engine.Step()) {
      EXPECT_TRUE(u.status.ok()) << u.request_id << ": " << u.status;
      auto& t = out[u.request_id];
      t.insert(t.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  return out;
}

TEST_F(CudaEngineLoraTest, AdaptersMoveBetweenSlotsWithoutChangingTokens) {
  std::mt19937 rng(3);
  std::vector<Job> jobs;
  const char* adapters[] = {"a1", "", "a2", "a3", "a1", "a3", "", "a2"};
  for (int i = 0; i < 8; ++i) {
    Job j{absl::StrCat("r", i), adapters[i], {1}};
    const int len = std::uniform_int_distribution<int>(5, 30)(rng);
    for (int k = 1; k < len; ++k) {
      j.prompt.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    }
    jobs.push_back(std::move(j));
  }
  std::map<std::string, std::vector<int32_t>> alone;
  for (const Job& j : jobs) {
    auto engine = MakeEngine(2, 2);
    ASSERT_TRUE(engine.ok()) << engine.status();
    alone[j.id] = RunJobs(**engine, {j})[j.id];
    ASSERT_EQ(alone[j.id].size(), 10u) << j.id;
  }
  EXPECT_NE(alone["r0"], alone["r4"]) << "different prompts";
  auto engine = MakeEngine(2, 2);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // Twice: the second wave (its prompts' KV now cached per adapter) needs adapters whose slots
  // the end of the first gave to others.
  for (int wave = 0; wave < 2; ++wave) {
    const auto mixed = RunJobs(**engine, jobs);
    for (const Job& j : jobs) EXPECT_EQ(mixed.at(j.id), alone[j.id]) << j.id << " wave " << wave;
  }
  EXPECT_GT(backend_->lora()->uploads(), 3) << "no adapter changed slots: the test checks nothing";
  EXPECT_LE(backend_->lora()->resident(), 2);
}

TEST_F(CudaEngineLoraTest, MoreAdaptersPerBatchThanSlotsIsRefusedAtStart) {
  auto engine = MakeEngine(1, 2);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  EXPECT_NE(engine.status().message().find("the device holds 1 adapters"), std::string::npos)
      << engine.status();
  auto no_slots = MakeEngine(0, 1);
  ASSERT_FALSE(no_slots.ok());
  EXPECT_NE(no_slots.status().message().find("lora_slots"), std::string::npos) << no_slots.status();
}

}  // namespace
}  // namespace tandem
