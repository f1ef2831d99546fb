// The CUDA backend end to end: the bundled models' reference outputs, agreement with the CPU
// backend on mixed prefill/decode batches (eager and CUDA-graph steps, key-range splits), KV
// region transfer between the two backends, and greedy decoding of a random Llama-1B.

#include <filesystem>
#include <fstream>
#include <random>

#include "common/engine/model/model_writer.h"
#include "tests/gpu/backend_runner.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::gpu_testing {
namespace {

using ::tandem::testing::Load;
using ::tandem::testing::LoadReference;
using ::tandem::testing::Reference;

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_REQUIRE_GPU(); }
};

CudaBackendOptions SmallOptions(int64_t num_blocks, DType kv_dtype) {
  CudaBackendOptions options;
  options.num_blocks = num_blocks;
  options.kv_dtype = kv_dtype;
  options.max_num_tokens = 256;
  options.max_num_seqs = 16;
  options.max_graph_batch = 16;
  return options;
}

// Greedy generation from "Once upon a time" with f32 weights reproduces the reference ids; the
// prompt runs eagerly, every decode step from a CUDA graph.
TEST_F(CudaBackendTest, StoriesF32GreedyMatchesReferenceIds) {
  Reference ref = LoadReference("stories260k");
  auto cuda = MakeCudaBackend(Load("stories260k", DType::kF32), SmallOptions(16, DType::kF32));
  ASSERT_NE(cuda, nullptr);
  const std::vector<int32_t> prompt(ref.sequence.begin(), ref.sequence.begin() + ref.prompt_len);
  const int steps = static_cast<int>(ref.sequence.size() - ref.prompt_len);
  std::vector<Seq> seqs;
  const auto generated = Greedy(*cuda, {prompt}, steps, &seqs);
  ASSERT_EQ(generated.size(), 1u);
  const std::vector<int32_t> want(ref.sequence.begin() + ref.prompt_len, ref.sequence.end());
  EXPECT_EQ(generated[0], want);
  EXPECT_EQ(cuda->eager_steps(), 1);
  EXPECT_EQ(cuda->graph_steps(), steps);
  // The logits after each fed token (prompt's last onwards) against the reference rows.
  const int64_t vocab = cuda->vocab_size();
  double worst = 0;
  for (size_t i = 0; i + 1 < seqs[0].logits.size() && generated[0] == want; ++i) {
    const size_t ref_row = ref.prompt_len - 1 + i;
    worst = std::max(
        worst, RelativeError(seqs[0].logits[i].data(), ref.logits.data() + ref_row * vocab, vocab));
  }
  EXPECT_LT(worst, 1e-3);
  std::printf("stories260k f32 on %s: worst relative logit error %.3g\n",
              kEmulated ? "emulator" : "GPU", worst);
}

// With bf16 weights the logits of both bundled models stay within the CPU backend's bf16
// tolerance of the float32 reference, prompt in one chunk then one token a step. (A bf16 KV cache
// adds error of its own; it is checked against the CPU backend below.)
TEST_F(CudaBackendTest, Bf16LogitsCloseToReference) {
  for (const char* name : {"stories260k", "llama2xs-280k"}) {
    for (DType kv : {DType::kF32}) {
      Reference ref = LoadReference(name);
      auto cuda = MakeCudaBackend(Load(name, DType::kBF16), SmallOptions(16, kv));
      ASSERT_NE(cuda, nullptr);
      const int64_t bs = cuda->kv_spec().block_size, vocab = cuda->vocab_size();
      Blocks blocks(bs, 16);
      Seq seq;
      seq.tokens = ref.sequence;
      std::vector<std::pair<Seq*, int64_t>> work = {{&seq, static_cast<int64_t>(ref.prompt_len)}};
      RunStep(*cuda, MakeStep(bs, blocks, work, true), work, true);
      work[0].second = 1;
      while (seq.computed + 1 < static_cast<int64_t>(seq.tokens.size())) {
        RunStep(*cuda, MakeStep(bs, blocks, work, true), work, true);
      }
      double worst = 0;
      for (size_t i = 0; i < seq.logits.size(); ++i) {
        worst = std::max(worst,
                         RelativeError(seq.logits[i].data(), ref.logits.data() + i * vocab, vocab));
      }
      EXPECT_LT(worst, 2e-2) << name << " kv " << DTypeName(kv);
    }
  }
}

// Random mixes of prefill chunks and decode tokens over several sequences: every logit row of
// the CUDA backend within 1e-3 of the CPU backend's with an f32 KV cache (f32 or bf16 weights).
// With a bf16 KV cache a K or V value whose f32 pre-image differs in the last bits between the
// backends can round to the neighbouring bf16 value, and this tiny model amplifies such one-ulp
// differences (rounding its whole cache to bf16 moves the logits by ~8%): 2e-2 there.
TEST_F(CudaBackendTest, MixedBatchesMatchCpuBackend) {
  for (DType weights : {DType::kF32, DType::kBF16}) {
    for (DType kv : {DType::kF32, DType::kBF16}) {
      auto model = Load("stories260k", weights);
      const int64_t num_blocks = 128;
      auto cpu = MakeCpuBackend(model, num_blocks, kv);
      auto cuda = MakeCudaBackend(model, SmallOptions(num_blocks, kv));
      ASSERT_TRUE(cpu && cuda);
      std::mt19937 rng(static_cast<uint32_t>(weights) * 2 + static_cast<uint32_t>(kv));
      const int num_seqs = 6;
      std::vector<Seq> on_cpu(num_seqs), on_cuda(num_seqs);
      for (int s = 0; s < num_seqs; ++s) {
        const int len = std::uniform_int_distribution<int>(2, 160)(rng);
        std::vector<int32_t> tokens = {1};
        for (int i = 1; i < len; ++i)
          tokens.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
        on_cpu[s].tokens = on_cuda[s].tokens = tokens;
      }
      Blocks cpu_blocks(16, num_blocks), cuda_blocks(16, num_blocks);
      for (int step = 0; step < (kEmulated ? 40 : 200); ++step) {
        std::vector<std::pair<Seq*, int64_t>> cpu_work, cuda_work;
        for (int s = 0; s < num_seqs; ++s) {
          const int64_t left = static_cast<int64_t>(on_cpu[s].tokens.size()) - on_cpu[s].computed;
          if (left == 0 || rng() % 4 == 0) continue;
          const int64_t chunk = std::min<int64_t>(left, 1 + rng() % 40);
          cpu_work.emplace_back(&on_cpu[s], chunk);
          cuda_work.emplace_back(&on_cuda[s], chunk);
        }
        if (cpu_work.empty()) continue;
        const bool all = rng() % 2 == 0;
        RunStep(*cpu, MakeStep(16, cpu_blocks, cpu_work, all), cpu_work, all);
        RunStep(*cuda, MakeStep(16, cuda_blocks, cuda_work, all), cuda_work, all);
        ASSERT_FALSE(HasFatalFailure());
      }
      for (int s = 0; s < num_seqs; ++s) {
        ASSERT_EQ(on_cpu[s].logits.size(), on_cuda[s].logits.size());
        for (size_t r = 0; r < on_cpu[s].logits.size(); ++r) {
          const double err = RelativeError(on_cuda[s].logits[r].data(), on_cpu[s].logits[r].data(),
                                           cuda->vocab_size());
          ASSERT_LT(err, kv == DType::kF32 ? 1e-3 : 2e-2)
              << "weights " << DTypeName(weights) << " kv " << DTypeName(kv) << " seq " << s
              << " row " << r;
        }
      }
    }
  }
}

// Decode-only steps: graph replays and eager runs give the same logits (to f32 rounding) at
// several batch sizes, including padded buckets.
TEST_F(CudaBackendTest, GraphAndEagerDecodeAgree) {
  auto model = Load("stories260k", DType::kF32);
  CudaBackendOptions with = SmallOptions(256, DType::kF32), without = with;
  without.cuda_graphs = false;
  auto graphs = MakeCudaBackend(model, with);
  auto eager = MakeCudaBackend(model, without);
  ASSERT_TRUE(graphs && eager);
  for (int n : {1, 3, 9}) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> p = {1};
      for (int k = 0; k < 3 + 41 * i % (kEmulated ? 120 : 400); ++k) {
        p.push_back(3 + (k * 31 + i) % 500);
      }
      prompts.push_back(p);
    }
    std::vector<Seq> a, b;
    const int steps = kEmulated ? 3 : 12;
    const auto ga = Greedy(*graphs, prompts, steps, &a);
    const auto gb = Greedy(*eager, prompts, steps, &b);
    EXPECT_EQ(ga, gb);
    for (int i = 0; i < n; ++i) {
      for (size_t r = 0; r < a[i].logits.size(); ++r) {
        EXPECT_LT(RelativeError(a[i].logits[r].data(), b[i].logits[r].data(), graphs->vocab_size()),
                  1e-5);
      }
    }
  }
  EXPECT_GT(graphs->graph_steps(), 0);
  EXPECT_EQ(eager->graph_steps(), 0);
}

// KV computed by the CPU backend, moved region by region (layer, block) into other block ids of
// the CUDA backend, decodes there like on the CPU; regions read back byte-identical; CopyBlock
// duplicates every layer of a block.
TEST_F(CudaBackendTest, KvRegionsMoveBetweenCpuAndCuda) {
  for (DType kv : {DType::kF32, DType::kBF16}) {
    auto model = Load("stories260k", DType::kF32);
    auto cpu = MakeCpuBackend(model, 32, kv);
    auto cuda = MakeCudaBackend(model, SmallOptions(32, kv));
    ASSERT_TRUE(cpu && cuda);
    ASSERT_EQ(cpu->kv_spec().bytes_per_block_layer(), cuda->kv_spec().bytes_per_block_layer());
    EXPECT_EQ(cuda->HostBlockRegion(0, 0), nullptr);
    std::vector<int32_t> prompt = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298,
                                   315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410};
    Seq on_cpu;
    on_cpu.tokens = prompt;
    on_cpu.tokens.push_back(408);
    Blocks cpu_blocks(16, 32, 1);
    std::vector<std::pair<Seq*, int64_t>> work = {{&on_cpu, static_cast<int64_t>(prompt.size())}};
    RunStep(*cpu, MakeStep(16, cpu_blocks, work, false), work, false);

    Seq on_cuda = on_cpu;
    on_cuda.logits.clear();
    on_cuda.blocks = {30, 5};  // other ids on the CUDA side
    const size_t region = cuda->kv_spec().bytes_per_block_layer();
    std::vector<uint8_t> bytes(region), back(region);
    for (int64_t l = 0; l < cuda->kv_spec().num_layers; ++l) {
      for (size_t b = 0; b < on_cpu.blocks.size(); ++b) {
        ASSERT_TRUE(cpu->ReadBlockRegion(l, on_cpu.blocks[b], bytes.data()).ok());
        ASSERT_TRUE(cuda->WriteBlockRegion(l, on_cuda.blocks[b], bytes.data()).ok());
        ASSERT_TRUE(cuda->ReadBlockRegion(l, on_cuda.blocks[b], back.data()).ok());
        EXPECT_EQ(back, bytes);
        const uint8_t* device = CudaDeviceBlockRegion(cuda.get(), l, on_cuda.blocks[b]);
        ASSERT_NE(device, nullptr);
        std::fill(back.begin(), back.end(), 0);
        TANDEM_CUDA_CHECK(cudaMemcpy(back.data(), device, region, cudaMemcpyDeviceToHost));
        EXPECT_EQ(back, bytes);
      }
    }
    EXPECT_EQ(CudaDeviceBlockRegion(cpu.get(), 0, 0), nullptr);
    EXPECT_EQ(CudaDeviceBlockRegion(cuda.get(), 0, 32), nullptr);
    EXPECT_FALSE(cuda->ReadBlockRegion(0, 32, back.data()).ok());
    EXPECT_FALSE(cuda->WriteBlockRegion(3, -1, back.data()).ok());

    work = {{&on_cpu, 1}};
    RunStep(*cpu, MakeStep(16, cpu_blocks, work, false), work, false);
    Blocks unused(16, 0);
    std::vector<std::pair<Seq*, int64_t>> cuda_work = {{&on_cuda, 1}};
    RunStep(*cuda, MakeStep(16, unused, cuda_work, false), cuda_work, false);
    EXPECT_LT(RelativeError(on_cuda.logits[0].data(), on_cpu.logits[1].data(), cuda->vocab_size()),
              1e-4)
        << DTypeName(kv);

    cuda->CopyBlock(5, 12);
    for (int64_t l = 0; l < cuda->kv_spec().num_layers; ++l) {
      ASSERT_TRUE(cuda->ReadBlockRegion(l, 5, bytes.data()).ok());
      ASSERT_TRUE(cuda->ReadBlockRegion(l, 12, back.data()).ok());
      EXPECT_EQ(back, bytes);
    }
  }
}

// A random "tiny" model with 2048 positions: an 1100-token prompt in chunks, then decode steps
// whose attention is split over the key range (eagerly and in a 2048-key graph bucket).
TEST_F(CudaBackendTest, LongContextMatchesCpu) {
  const std::string dir = std::filesystem::path(::testing::TempDir()) / "cuda_backend_tiny";
  RandomModelOptions random;
  random.preset = "tiny";
  random.dtype = DType::kF32;
  random.seed = 3;
  random.init_std = 0.1;
  ASSERT_TRUE(WriteRandomModel(random, dir).ok());
  LoadOptions load;
  load.weight_dtype_auto = false;
  load.weight_dtype = DType::kF32;
  auto loaded = LoadModel(dir, load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::shared_ptr<const Model> model = std::move(loaded).value();
  auto cpu = MakeCpuBackend(model, 96, DType::kF32);
  CudaBackendOptions options = SmallOptions(96, DType::kF32);
  options.max_num_tokens = 512;
  auto cuda = MakeCudaBackend(model, options);
  ASSERT_TRUE(cpu && cuda);
  std::mt19937 rng(4);
  std::vector<int32_t> prompt = {1};
  for (int i = 1; i < 1100; ++i)
    prompt.push_back(std::uniform_int_distribution<int>(3, 31999)(rng));
  Seq a, b;
  a.tokens = b.tokens = prompt;
  Blocks ba(16, 96), bb(16, 96);
  for (int64_t chunk : {512, 512, 76}) {
    std::vector<std::pair<Seq*, int64_t>> wa = {{&a, chunk}}, wb = {{&b, chunk}};
    RunStep(*cpu, MakeStep(16, ba, wa, false), wa, false);
    RunStep(*cuda, MakeStep(16, bb, wb, false), wb, false);
  }
  for (int step = 0; step < 4; ++step) {
    const int32_t next = Argmax(a.logits.back());
    a.tokens.push_back(next);
    b.tokens.push_back(next);
    std::vector<std::pair<Seq*, int64_t>> wa = {{&a, 1}}, wb = {{&b, 1}};
    RunStep(*cpu, MakeStep(16, ba, wa, false), wa, false);
    RunStep(*cuda, MakeStep(16, bb, wb, false), wb, false);
  }
  // Two tokens at once (like a speculative verification): an eager step with split attention.
  for (int32_t t : {5, 6}) {
    a.tokens.push_back(t);
    b.tokens.push_back(t);
  }
  std::vector<std::pair<Seq*, int64_t>> wa = {{&a, 2}}, wb = {{&b, 2}};
  RunStep(*cpu, MakeStep(16, ba, wa, true), wa, true);
  RunStep(*cuda, MakeStep(16, bb, wb, true), wb, true);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t r = 0; r < a.logits.size(); ++r) {
    EXPECT_LT(RelativeError(b.logits[r].data(), a.logits[r].data(), cuda->vocab_size()), 1e-3)
        << "row " << r;
  }
  EXPECT_EQ(cuda->graph_steps(), 4);
  std::filesystem::remove_all(dir);
}

// Phi-3 (fused projections split at load, LongRoPE from position 32 on, a 48-token sliding
// window) agrees with the CPU backend over 100 positions; Qwen3, Gemma 2 and 3, partial-rotary
// Phi-3 (Phi-4-mini), Mixtral and Qwen2-MoE are refused by name until the backend implements
// their norms, soft-capping, partial rotation and experts.
TEST_F(CudaBackendTest, Phi3MatchesCpuQwen3Gemma3AndMixtralAreRefused) {
  for (const char* preset : {"phi3-tiny", "qwen3-tiny", "gemma3-tiny", "gemma2-tiny", "phi4-tiny",
                             "mixtral-tiny", "qwen2moe-tiny"}) {
    const std::string dir = std::filesystem::path(::testing::TempDir()) / preset;
    RandomModelOptions random;
    random.preset = preset;
    random.dtype = DType::kF32;
    random.seed = 5;
    random.init_std = 0.1;
    random.vocab_size = 512;
    ASSERT_TRUE(WriteRandomModel(random, dir).ok());
    LoadOptions load;
    load.weight_dtype_auto = false;
    load.weight_dtype = DType::kF32;
    auto loaded = LoadModel(dir, load);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    std::shared_ptr<const Model> model = std::move(loaded).value();
    std::filesystem::remove_all(dir);
    if (std::string(preset) != "phi3-tiny") {
      auto refused = cuda::CudaBackend::Create(model, SmallOptions(16, DType::kF32));
      ASSERT_FALSE(refused.ok());
      EXPECT_NE(std::string(refused.status().message()).find(model->config().architecture_name),
                std::string::npos)
          << refused.status();
      continue;
    }
    auto cpu = MakeCpuBackend(model, 16, DType::kF32);
    auto cuda = MakeCudaBackend(model, SmallOptions(16, DType::kF32));
    ASSERT_TRUE(cpu && cuda);
    std::mt19937 rng(6);
    std::vector<int32_t> prompt = {1};
    for (int i = 1; i < 96; ++i) prompt.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    Seq a, b;
    a.tokens = b.tokens = prompt;
    Blocks ba(16, 16), bb(16, 16);
    std::vector<std::pair<Seq*, int64_t>> wa = {{&a, 96}}, wb = {{&b, 96}};
    RunStep(*cpu, MakeStep(16, ba, wa, false), wa, false);
    RunStep(*cuda, MakeStep(16, bb, wb, false), wb, false);
    for (int step = 0; step < 4; ++step) {
      const int32_t next = Argmax(a.logits.back());
      a.tokens.push_back(next);
      b.tokens.push_back(next);
      wa = {{&a, 1}};
      wb = {{&b, 1}};
      RunStep(*cpu, MakeStep(16, ba, wa, false), wa, false);
      RunStep(*cuda, MakeStep(16, bb, wb, false), wb, false);
    }
    ASSERT_EQ(a.logits.size(), b.logits.size());
    for (size_t r = 0; r < a.logits.size(); ++r) {
      EXPECT_LT(RelativeError(b.logits[r].data(), a.logits[r].data(), cuda->vocab_size()), 1e-3)
          << preset << " row " << r;
    }
  }
}

// A random Llama-3.2-1B-shaped model in bf16: greedy decoding of 8 prompts for 32 tokens gives
// the CPU backend's tokens. (GPU only: far too slow for the emulator.)
TEST_F(CudaBackendTest, RandomLlama1bBf16GreedyAgreesWithCpu) {
  if (kEmulated) GTEST_SKIP() << "too large for the emulator";
  const std::string dir = std::string(TANDEM_BINARY_DIR) + "/gpu_test_models/llama-1b-bf16";
  if (!std::filesystem::exists(dir + "/config.json")) {
    RandomModelOptions random;
    random.preset = "llama-1b";
    random.dtype = DType::kBF16;
    random.seed = 1;
    ASSERT_TRUE(WriteRandomModel(random, dir).ok());
  }
  LoadOptions load;
  load.weight_dtype_auto = false;
  load.weight_dtype = DType::kBF16;
  auto loaded = LoadModel(dir, load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::shared_ptr<const Model> model = std::move(loaded).value();
  std::mt19937 rng(8);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = {1};
    const int len = std::uniform_int_distribution<int>(4, 60)(rng);
    for (int k = 0; k < len; ++k) p.push_back(std::uniform_int_distribution<int>(3, 31999)(rng));
    prompts.push_back(p);
  }
  auto cpu = MakeCpuBackend(model, 64, DType::kBF16);
  auto cuda = MakeCudaBackend(model, SmallOptions(64, DType::kBF16));
  ASSERT_TRUE(cpu && cuda);
  std::vector<Seq> cpu_seqs;
  const auto want = Greedy(*cpu, prompts, 32, &cpu_seqs);
  const auto got = Greedy(*cuda, prompts, 32);
  for (int i = 0; i < 8; ++i) {
    for (int k = 0; k < 32; ++k) {
      if (got[i][k] == want[i][k]) continue;
      const auto& row = cpu_seqs[i].logits[k];
      ADD_FAILURE() << "prompt " << i << " token " << k << ": cuda " << got[i][k] << ", cpu "
                    << want[i][k] << " (cpu logits " << row[want[i][k]] << " vs " << row[got[i][k]]
                    << ")";
      break;
    }
  }
}

}  // namespace
}  // namespace tandem::gpu_testing
