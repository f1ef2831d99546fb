// The CUDA backend's LoRA path (device_lora.h, lora_kernels.cu) against the CPU backend's
// (cpu/lora.h) on the same model and adapters: random mixes of prefill chunks and decode tokens
// where sequences of several adapters (f32 and bf16, ranks 4 to 16, all or some targets) and of
// the base model share every step, for f32 / bf16 / int8 / int4 base weights; a sequence gets
// its own adapter's terms and no other's (alone and in a mixed batch, against the runs of the
// other adapters); the device memory for adapters is reserved when the backend is made, an
// adapter takes a slot when first used and leaves it once gone, or for another adapter when
// every slot is taken (the least recently used one).

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/engine/lora/lora_adapter.h"
#include "common/engine/lora/lora_writer.h"
#include "tests/gpu/backend_runner.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::gpu_testing {
namespace {

namespace fs = std::filesystem;
using ::tandem::testing::Load;
using ::tandem::testing::ModelDir;

// `lora_slots` adapters of rank 16 in bf16 (an f32 adapter of rank 8 fits such a slot too).
CudaBackendOptions Options(int64_t num_blocks, bool bf16_activations, int64_t lora_slots = 3) {
  CudaBackendOptions options;
  options.lora_slots = lora_slots;
  options.lora_max_rank = 16;
  options.lora_dtype = DType::kBF16;
  options.num_blocks = num_blocks;
  options.kv_dtype = DType::kF32;
  options.max_num_tokens = 256;
  options.max_num_seqs = 16;
  options.max_graph_tokens = 16;
  options.bf16_activations = bf16_activations;
  return options;
}

// Runs the step `work` on `backend`, each sequence with its adapter (lora[seq index]).
void RunLoraStep(Backend& backend, Blocks& blocks, std::vector<Seq>& seqs,
                 const std::vector<const LoraAdapter*>& lora,
                 const std::vector<std::pair<Seq*, int64_t>>& work, bool all_logits) {
  ForwardBatch batch = MakeStep(16, blocks, work, all_logits);
  for (size_t i = 0; i < work.size(); ++i) {
    batch.seqs[i].lora = lora[work[i].first - seqs.data()];
  }
  RunStep(backend, batch, work, all_logits);
}

class CudaLoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_REQUIRE_GPU();
    root_ = (fs::path(::testing::TempDir()) /
             (std::string("cuda_lora_") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(root_);
    auto config = LoadModelConfig(ModelDir("stories260k") + "/config.json");
    ASSERT_TRUE(config.ok());
    config_ = *config;
  }
  void TearDown() override { fs::remove_all(root_); }

  // A random adapter; std 0.2 moves the logits far beyond the comparison tolerances.
  std::shared_ptr<const LoraAdapter> Adapter(uint64_t seed, int64_t rank, DType dtype,
                                             std::vector<std::string> targets = {}) {
    RandomLoraOptions o;
    o.seed = seed;
    o.rank = rank;
    o.alpha = 2.0 * static_cast<double>(rank);
    o.std = 0.2;
    o.dtype = dtype;
    if (!targets.empty()) o.targets = targets;
    const std::string dir = absl::StrCat(root_, "/", seed);
    EXPECT_TRUE(WriteRandomLoraAdapter(config_, o, dir).ok());
    auto a = LoadLoraAdapter(absl::StrCat("a", seed), dir, config_, LoraLimits());
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : nullptr;
  }

  std::string root_;
  ModelConfig config_;
};

// Random mixed steps (prefill chunks of up to 40 tokens, decode steps of one token per sequence)
// of six sequences over three adapters and the base model, the same on both backends: every
// logit row of the CUDA backend close to the CPU's, while each adapter moves its sequences'
// logits away from the base model's by more than three times the bound (an adapter's term on
// the wrong row, or missing, fails). With f32 activations 1e-3, the dense backend comparison's
// bound (sums in another order; measured 1.3e-5 over f32 weights, 3e-4 over bf16 ones). With
// bf16 activations an activation whose f32 value differs in its last bits between the backends
// can round to the neighbouring bf16 value (the 3e-2 of the base-model comparisons), and these
// adapters, whose terms are as large as the base products' (they move the logits by 0.6 to
// 0.9), amplify such a flip further: 1e-1 (measured up to 5.6e-2 in the emulator). The exact
// check of each row's adapter is EachRowGetsItsOwnAdapter.
TEST_F(CudaLoraTest, MixedAdapterBatchesMatchCpuBackend) {
  auto a = Adapter(1, 8, DType::kF32);
  auto b = Adapter(2, 16, DType::kBF16);
  auto c = Adapter(3, 4, DType::kBF16, {"q_proj", "v_proj", "down_proj"});
  ASSERT_TRUE(a && b && c);
  struct Format {
    DType weights;
    WeightQuant quant;
    int64_t group;
    bool bf16_activations;
  };
  const Format formats[] = {{DType::kF32, WeightQuant::kNone, 0, false},
                            {DType::kBF16, WeightQuant::kNone, 0, false},
                            {DType::kBF16, WeightQuant::kNone, 0, true},
                            {DType::kBF16, WeightQuant::kInt8, 128, true},
                            {DType::kBF16, WeightQuant::kInt4, 32, true}};
  for (const Format& f : formats) {
    // The emulator (a CPU, CI's time): the parity mode over f32 weights stands for both dense
    // dtypes.
    if (kEmulated && f.weights == DType::kBF16 && !f.bf16_activations) continue;
    const std::string what =
        absl::StrCat(std::string(DTypeName(f.weights)), " ", std::string(WeightQuantName(f.quant)),
                     f.bf16_activations ? " bf16" : " f32", " activations");
    auto model = Load("stories260k", f.weights, f.quant, f.group);
    const int64_t num_blocks = 128;
    auto cpu = MakeCpuBackend(model, num_blocks, DType::kF32,
                              f.bf16_activations ? DType::kBF16 : DType::kF32);
    auto cuda = MakeCudaBackend(model, Options(num_blocks, f.bf16_activations));
    auto cuda_base = MakeCudaBackend(model, Options(num_blocks, f.bf16_activations));
    ASSERT_TRUE(cpu && cuda && cuda_base) << what;
    ASSERT_TRUE(cuda->CheckLora(3, 16, DType::kBF16).ok());
    const std::vector<const LoraAdapter*> lora = {a.get(), nullptr, b.get(),
                                                  a.get(), c.get(), nullptr};
    const int num_seqs = static_cast<int>(lora.size());
    std::mt19937 rng(static_cast<uint32_t>(f.quant) * 5 + (f.bf16_activations ? 1 : 0));
    std::vector<Seq> on_cpu(num_seqs), on_cuda(num_seqs), base(num_seqs);
    for (int s = 0; s < num_seqs; ++s) {
      const int len = std::uniform_int_distribution<int>(12, kEmulated ? 40 : 60)(rng);
      std::vector<int32_t> tokens = {1};
      for (int i = 1; i < len; ++i) {
        tokens.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
      }
      on_cpu[s].tokens = on_cuda[s].tokens = base[s].tokens = tokens;
    }
    Blocks cpu_blocks(16, num_blocks), cuda_blocks(16, num_blocks), base_blocks(16, num_blocks);
    const std::vector<const LoraAdapter*> no_lora(num_seqs, nullptr);
    for (int step = 0; step < (kEmulated ? 10 : 60); ++step) {
      std::vector<std::pair<Seq*, int64_t>> cw, gw, bw;
      for (int s = 0; s < num_seqs; ++s) {
        const int64_t left = static_cast<int64_t>(on_cpu[s].tokens.size()) - on_cpu[s].computed;
        if (left == 0 || rng() % 5 == 0) continue;
        const int64_t chunk = std::min<int64_t>(left, step % 3 == 0 ? 1 + rng() % 40 : 1);
        cw.emplace_back(&on_cpu[s], chunk);
        gw.emplace_back(&on_cuda[s], chunk);
        bw.emplace_back(&base[s], chunk);
      }
      if (cw.empty()) continue;
      const bool all = rng() % 2 == 0;
      RunLoraStep(*cpu, cpu_blocks, on_cpu, lora, cw, all);
      RunLoraStep(*cuda, cuda_blocks, on_cuda, lora, gw, all);
      RunLoraStep(*cuda_base, base_blocks, base, no_lora, bw, all);
      ASSERT_FALSE(HasFatalFailure()) << what;
    }
    const double tol = f.bf16_activations ? 1e-1 : 1e-3;
    double worst = 0, least_moved = 1e30;
    int64_t rows = 0;
    for (int s = 0; s < num_seqs; ++s) {
      ASSERT_EQ(on_cpu[s].logits.size(), on_cuda[s].logits.size());
      for (size_t r = 0; r < on_cpu[s].logits.size(); ++r, ++rows) {
        const double err = RelativeError(on_cuda[s].logits[r].data(), on_cpu[s].logits[r].data(),
                                         cuda->vocab_size());
        worst = std::max(worst, err);
        ASSERT_LT(err, tol) << what << " seq " << s << " row " << r;
        const double moved = RelativeError(on_cuda[s].logits[r].data(), base[s].logits[r].data(),
                                           cuda->vocab_size());
        if (lora[s] == nullptr) {  // eager steps here, graphs there: the same kernels
          if (kEmulated) {
            EXPECT_EQ(on_cuda[s].logits[r], base[s].logits[r]) << what << " base seq " << s;
          } else {
            EXPECT_LT(moved, tol) << what << " base seq " << s;
          }
        } else if (r > 0 || lora[s] != c.get()) {  // c's first row: q alone moves nothing
          least_moved = std::min(least_moved, moved);
        }
      }
    }
    EXPECT_GT(least_moved, 3 * tol) << what;
    EXPECT_GT(cuda->eager_steps(), 0);
    std::printf("%s: %lld rows, worst relative error vs CPU %.3g, least adapter effect %.3g\n",
                what.c_str(), static_cast<long long>(rows), worst, least_moved);
  }
}

// Decode steps of three sequences with the same prompt under adapters a, b and the base model,
// in every arrangement of one batch (each alone, then all rotations): a sequence's logits are
// those of its own adapter alone (bit for bit in the emulator, whose cuBLAS stand-in is row by
// row; on a GPU within 1e-3, cuBLAS choosing its algorithm by row count) and far (> 0.1) from
// those of the others. An adapter's term landing on a neighbouring row fails this.
TEST_F(CudaLoraTest, EachRowGetsItsOwnAdapter) {
  auto a = Adapter(4, 8, DType::kBF16);
  auto b = Adapter(5, 8, DType::kBF16);
  ASSERT_TRUE(a && b);
  auto model = Load("stories260k", DType::kBF16);
  auto cuda = MakeCudaBackend(model, Options(64, true));
  ASSERT_NE(cuda, nullptr);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 290, 17, 99, 311};
  const std::vector<const LoraAdapter*> choices = {a.get(), b.get(), nullptr};
  // Each adapter alone: the prompt, then 3 decode steps of fixed tokens.
  auto run = [&](const std::vector<const LoraAdapter*>& order) {
    Blocks blocks(16, 64);
    std::vector<Seq> seqs(order.size());
    std::vector<std::pair<Seq*, int64_t>> work;
    for (size_t i = 0; i < order.size(); ++i) {
      seqs[i].tokens = prompt;
      for (int32_t t : {5, 77, 300}) seqs[i].tokens.push_back(t);
      work.emplace_back(&seqs[i], static_cast<int64_t>(prompt.size()));
    }
    for (int step = 0; step < 4; ++step) {
      RunLoraStep(*cuda, blocks, seqs, order, work, false);
      for (auto& w : work) w.second = 1;
    }
    return seqs;
  };
  std::vector<std::vector<std::vector<float>>> alone;
  for (const LoraAdapter* l : choices) alone.push_back(run({l})[0].logits);
  for (size_t i = 0; i < choices.size(); ++i) {
    for (size_t j = i + 1; j < choices.size(); ++j) {
      EXPECT_GT(RelativeError(alone[i].back().data(), alone[j].back().data(), 512), 0.1)
          << "adapters " << i << " and " << j << " barely differ: the test would not see a swap";
    }
  }
  for (int rot = 0; rot < 3; ++rot) {
    std::vector<const LoraAdapter*> order;
    std::vector<int> which;
    for (int k = 0; k < 3; ++k) {
      which.push_back((k + rot) % 3);
      order.push_back(choices[which.back()]);
    }
    const std::vector<Seq> mixed = run(order);
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(mixed[k].logits.size(), alone[which[k]].size());
      for (size_t r = 0; r < mixed[k].logits.size(); ++r) {
        const double err = RelativeError(mixed[k].logits[r].data(), alone[which[k]][r].data(), 512);
        EXPECT_LE(err, kEmulated ? 0.0 : 1e-3)
            << "rotation " << rot << " row " << k << " (adapter " << which[k] << ") step " << r;
      }
    }
  }
}

// The adapters' device memory is reserved when the backend is made and no step allocates more:
// adapters are uploaded into slots when a step first uses them, once, and their slots freed at
// the first step after the last reference to them is dropped (an unloaded adapter whose requests
// are done); a step of the base model alone runs the graphs.
TEST_F(CudaLoraTest, AdaptersTakeReservedSlotsOnFirstUseAndLeaveThemWhenGone) {
  auto a = Adapter(6, 8, DType::kBF16);
  auto b = Adapter(7, 8, DType::kF32);
  ASSERT_TRUE(a && b);
  auto model = Load("stories260k", DType::kBF16);
  auto cuda = MakeCudaBackend(model, Options(64, true, 2));
  ASSERT_NE(cuda, nullptr);
  ASSERT_NE(cuda->lora(), nullptr);
  const size_t reserved = cuda->lora()->reserved_bytes();
  EXPECT_GE(reserved, 2 * cuda::DeviceLora::SlotBytes(model->config(), cuda->lora()->options()));
  Blocks blocks(16, 64);
  std::vector<Seq> seqs(2);
  seqs[0].tokens = {1, 403, 407, 261, 378, 9, 10, 11};
  seqs[1].tokens = {1, 300, 17, 99, 311, 9, 10, 11};
  std::vector<std::pair<Seq*, int64_t>> work = {{&seqs[0], 3}, {&seqs[1], 3}};
  RunLoraStep(*cuda, blocks, seqs, {nullptr, nullptr}, work, false);
  EXPECT_EQ(cuda->lora()->resident(), 0);
  EXPECT_EQ(cuda->graph_steps(), 1);
  work = {{&seqs[0], 1}, {&seqs[1], 1}};
  RunLoraStep(*cuda, blocks, seqs, {a.get(), b.get()}, work, false);
  EXPECT_EQ(cuda->lora()->resident(), 2);
  EXPECT_EQ(cuda->lora()->uploads(), 2);
  EXPECT_EQ(cuda->eager_steps(), 1);
  RunLoraStep(*cuda, blocks, seqs, {a.get(), b.get()}, work, false);
  EXPECT_EQ(cuda->lora()->uploads(), 2) << "an adapter on the device was uploaded again";
  b.reset();  // the last reference: unloaded and its requests done
  RunLoraStep(*cuda, blocks, seqs, {a.get(), nullptr}, {{&seqs[0], 1}}, false);
  EXPECT_EQ(cuda->lora()->resident(), 1);
  EXPECT_EQ(cuda->lora()->uploads(), 2);
  EXPECT_EQ(cuda->lora()->reserved_bytes(), reserved) << "a step allocated device memory";
}

// More adapters in use than slots: a step needing a slot takes the least recently used one of an
// adapter it does not use, and that adapter is uploaded again when a later step needs it; every
// sequence's logits are bit for bit those of a backend where every adapter kept its slot. A step
// with more adapters than slots is refused with a clear error and the backend goes on serving.
// A backend without slots refuses adapters.
TEST_F(CudaLoraTest, SlotsAreReusedLeastRecentlyUsedFirst) {
  auto a = Adapter(8, 8, DType::kBF16);
  auto b = Adapter(9, 16, DType::kBF16);
  auto c = Adapter(10, 4, DType::kBF16, {"k_proj", "o_proj", "up_proj"});
  ASSERT_TRUE(a && b && c);
  auto model = Load("stories260k", DType::kBF16);
  auto two = MakeCudaBackend(model, Options(64, true, 2));
  auto three = MakeCudaBackend(model, Options(64, true, 3));
  ASSERT_TRUE(two && three);
  EXPECT_TRUE(two->CheckLora(2, 16, DType::kBF16).ok());
  EXPECT_FALSE(two->CheckLora(3, 16, DType::kBF16).ok());
  EXPECT_FALSE(two->CheckLora(2, 32, DType::kBF16).ok());
  EXPECT_FALSE(two->CheckLora(2, 16, DType::kF32).ok());
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 290, 17, 99, 311, 5, 77, 300};
  // Three sequences, one per adapter; each step runs two of them (a pair that needs the slot of
  // the third's adapter in turn).
  const std::vector<const LoraAdapter*> lora = {a.get(), b.get(), c.get()};
  const std::vector<std::vector<int>> pairs = {{0, 1}, {1, 2}, {2, 0}, {0, 1}, {2, 1}, {0, 2}};
  auto run = [&](cuda::CudaBackend& backend) {
    Blocks blocks(16, 64);
    std::vector<Seq> seqs(3);
    for (Seq& s : seqs) s.tokens = prompt;
    for (const std::vector<int>& pair : pairs) {
      std::vector<std::pair<Seq*, int64_t>> work;
      for (int i : pair) work.emplace_back(&seqs[i], seqs[i].computed == 0 ? 4 : 1);
      RunLoraStep(backend, blocks, seqs, lora, work, false);
    }
    return seqs;
  };
  const std::vector<Seq> with_two = run(*two), with_three = run(*three);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(three->lora()->uploads(), 3);
  EXPECT_GT(two->lora()->uploads(), 3) << "no adapter lost its slot: the test checks nothing";
  EXPECT_EQ(two->lora()->resident(), 2);
  for (int s = 0; s < 3; ++s) {
    ASSERT_EQ(with_two[s].logits.size(), with_three[s].logits.size());
    for (size_t r = 0; r < with_two[s].logits.size(); ++r) {
      const double err = RelativeError(with_two[s].logits[r].data(), with_three[s].logits[r].data(),
                                       two->vocab_size());
      EXPECT_LE(err, kEmulated ? 0.0 : 1e-3) << "seq " << s << " row " << r;
    }
  }

  Blocks blocks(16, 64);
  std::vector<Seq> seqs(3);
  for (Seq& s : seqs) s.tokens = prompt;
  ForwardBatch all = MakeStep(16, blocks, {{&seqs[0], 2}, {&seqs[1], 2}, {&seqs[2], 2}}, false);
  for (int i = 0; i < 3; ++i) all.seqs[i].lora = lora[i];
  std::vector<float> logits(all.logit_rows.size() * two->vocab_size());
  const absl::Status refused = two->Forward(all, logits.data());
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  std::vector<Seq> after(1);
  after[0].tokens = prompt;
  RunLoraStep(*two, blocks, after, {c.get()}, {{&after[0], 4}}, false);

  auto none = MakeCudaBackend(model, Options(64, true, 0));
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->lora(), nullptr);
  EXPECT_FALSE(none->CheckLora(1, 8, DType::kBF16).ok());
  Blocks none_blocks(16, 64);
  ForwardBatch one = MakeStep(16, none_blocks, {{&after[0], 1}}, false);
  one.seqs[0].lora = a.get();
  EXPECT_EQ(none->Forward(one, logits.data()).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::gpu_testing
