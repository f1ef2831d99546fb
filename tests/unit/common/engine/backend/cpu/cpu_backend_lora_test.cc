// The CPU backend's LoRA path (lora.h): an adapter's terms are added to exactly its own
// sequences' projections, the same bits whatever else shares the step (other adapters, the base
// model), for every base weight format; the adapter's own dtype (f32 / bf16) is honoured.

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/engine/lora/lora_adapter.h"
#include "common/engine/lora/lora_writer.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::testing {
namespace {

namespace fs = std::filesystem;

struct Seq {
  std::vector<int32_t> tokens;
  const LoraAdapter* lora = nullptr;
  std::vector<int32_t> blocks;
  std::vector<float> logits;  // [tokens, vocab]
};

// One prefill step over `seqs` (fresh blocks each), logits at every position.
void Prefill(CpuBackend& backend, std::vector<Seq*> seqs) {
  ForwardBatch batch;
  const int64_t bs = backend.kv_spec().block_size;
  int32_t next_block = 0;
  for (Seq* s : seqs) {
    s->blocks.clear();
    while (static_cast<int64_t>(s->blocks.size()) * bs < static_cast<int64_t>(s->tokens.size())) {
      s->blocks.push_back(next_block++);
    }
    batch.AddSequenceRows(s->tokens, 0, s->blocks, bs, static_cast<int64_t>(s->tokens.size()));
    batch.seqs.back().lora = s->lora;
  }
  const int64_t vocab = backend.vocab_size();
  std::vector<float> logits(batch.logit_rows.size() * vocab);
  absl::Status st = backend.Forward(batch, logits.data());
  ASSERT_TRUE(st.ok()) << st;
  size_t row = 0;
  for (Seq* s : seqs) {
    s->logits.assign(logits.begin() + row * vocab,
                     logits.begin() + (row + s->tokens.size()) * vocab);
    row += s->tokens.size();
  }
}

std::vector<int32_t> Tokens(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t = {1};
  for (int i = 1; i < n; ++i) t.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
  return t;
}

class LoraBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::path(::testing::TempDir()) /
             (std::string("lora_backend_") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(root_);
    auto config = LoadModelConfig(ModelDir("stories260k") + "/config.json");
    ASSERT_TRUE(config.ok());
    config_ = *config;
  }
  void TearDown() override { fs::remove_all(root_); }

  std::shared_ptr<const LoraAdapter> Adapter(uint64_t seed, DType dtype = DType::kF32,
                                             std::vector<std::string> targets = {}) {
    RandomLoraOptions o;
    o.seed = seed;
    o.rank = 8;
    o.alpha = 16;
    o.std = 0.05;
    o.dtype = dtype;
    if (!targets.empty()) o.targets = targets;
    const std::string dir =
        absl::StrCat(root_, "/", seed, "_", std::string(DTypeName(dtype)), "_", targets.size());
    EXPECT_TRUE(WriteRandomLoraAdapter(config_, o, dir).ok());
    auto a = LoadLoraAdapter(absl::StrCat("a", seed), dir, config_, LoraLimits());
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : nullptr;
  }
  std::unique_ptr<CpuBackend> Backend(std::shared_ptr<const Model> model,
                                      DType input = DType::kF32) {
    CpuBackendOptions o;
    o.num_blocks = 64;
    o.num_threads = 2;
    o.kv_dtype = DType::kF32;
    o.matmul_input_dtype = input;
    auto b = CpuBackend::Create(model, o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(b).value() : nullptr;
  }

  std::string root_;
  ModelConfig config_;
};

struct Format {
  DType weights;
  WeightQuant quant;
  int64_t group;
  DType input;
};

class LoraFormatsTest : public LoraBackendTest, public ::testing::WithParamInterface<Format> {};

// A sequence under adapter A gives the same logits alone and in one batch with the base model,
// adapter B and another sequence of A; the base sequence the same as without any adapter.
TEST_P(LoraFormatsTest, SameBitsAloneAndInAMixedBatch) {
  const Format& f = GetParam();
  auto model = Load("stories260k", f.weights, f.quant, f.group, f.input);
  ASSERT_NE(model, nullptr);
  auto backend = Backend(model, f.input);
  ASSERT_NE(backend, nullptr);
  auto a = Adapter(1), b = Adapter(2, DType::kBF16);
  ASSERT_TRUE(a && b);

  Seq alone{Tokens(7, 21), a.get()};
  Prefill(*backend, {&alone});
  Seq base_alone{Tokens(8, 13), nullptr};
  Prefill(*backend, {&base_alone});
  Seq base_of_alone{alone.tokens, nullptr};
  Prefill(*backend, {&base_of_alone});

  Seq base{base_alone.tokens, nullptr}, x{alone.tokens, a.get()}, y{Tokens(9, 17), b.get()},
      z{Tokens(10, 5), a.get()};
  Seq y_alone = y, z_alone = z;
  Prefill(*backend, {&y_alone});
  Prefill(*backend, {&z_alone});
  Prefill(*backend, {&base, &x, &y, &z});
  EXPECT_EQ(x.logits, alone.logits) << "adapter A's sequence changed in a mixed batch";
  EXPECT_EQ(base.logits, base_alone.logits) << "the base sequence changed in a mixed batch";
  EXPECT_EQ(y.logits, y_alone.logits) << "adapter B's sequence changed in a mixed batch";
  EXPECT_EQ(z.logits, z_alone.logits) << "A's second, non-adjacent sequence changed";
  // The adapter is honoured: its logits differ from the base model's clearly.
  const int64_t vocab = backend->vocab_size();
  double moved = 0;
  for (size_t p = 0; p < alone.tokens.size(); ++p) {
    moved = std::max(moved, RowRelativeError(alone.logits.data() + p * vocab,
                                             base_of_alone.logits.data() + p * vocab, vocab));
  }
  EXPECT_GT(moved, 0.02);
}

INSTANTIATE_TEST_SUITE_P(Weights, LoraFormatsTest,
                         ::testing::Values(Format{DType::kF32, WeightQuant::kNone, 0, DType::kF32},
                                           Format{DType::kBF16, WeightQuant::kNone, 0, DType::kF32},
                                           Format{DType::kBF16, WeightQuant::kNone, 0,
                                                  DType::kBF16},
                                           Format{DType::kF32, WeightQuant::kInt8, 0, DType::kF32},
                                           Format{DType::kF32, WeightQuant::kInt4, 32, DType::kF32},
                                           Format{DType::kBF16, WeightQuant::kInt8, 0, DType::kI8}),
                         [](const auto& info) {
                           return absl::StrCat(std::string(DTypeName(info.param.weights)), "_",
                                               std::string(WeightQuantName(info.param.quant)),
                                               "_inputs_",
                                               std::string(DTypeName(info.param.input)));
                         });

// The adapter's term is the same on every base format (it is computed in f32 from the f32
// activations): what the adapter adds to the logits on a quantized base is close to what it
// adds on the f32 base.
TEST_F(LoraBackendTest, AdapterMovesQuantizedBasesLikeTheF32Base) {
  auto a = Adapter(3);
  ASSERT_NE(a, nullptr);
  auto delta = [&](std::shared_ptr<const Model> model) {
    auto backend = Backend(model);
    Seq with{Tokens(11, 9), a.get()}, without{Tokens(11, 9), nullptr};
    Prefill(*backend, {&with});
    Prefill(*backend, {&without});
    std::vector<float> d(with.logits.size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = with.logits[i] - without.logits[i];
    return d;
  };
  const std::vector<float> f32 = delta(Load("stories260k", DType::kF32));
  const std::vector<float> int8 = delta(Load("stories260k", DType::kF32, WeightQuant::kInt8));
  const int64_t vocab = 512;
  for (size_t p = 0; p < f32.size() / vocab; ++p) {
    EXPECT_LT(RowRelativeError(int8.data() + p * vocab, f32.data() + p * vocab, vocab), 0.1)
        << "position " << p;
  }
}

// An adapter targeting nothing of a projection leaves it alone: an adapter of q_proj only
// differs from one with the same q_proj and every other module.
TEST_F(LoraBackendTest, OnlyTargetedModulesChange) {
  auto model = Load("stories260k", DType::kF32);
  auto backend = Backend(model);
  auto q_only = Adapter(5, DType::kF32, {"q_proj"});
  auto all = Adapter(5, DType::kF32,
                     {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  ASSERT_TRUE(q_only && all);
  Seq base{Tokens(12, 9), nullptr}, q{Tokens(12, 9), q_only.get()}, full{Tokens(12, 9), all.get()};
  Prefill(*backend, {&base});
  Prefill(*backend, {&q});
  Prefill(*backend, {&full});
  // The first position attends to itself only: q changes nothing there (softmax of one key).
  const int64_t vocab = backend->vocab_size();
  EXPECT_TRUE(std::equal(q.logits.begin(), q.logits.begin() + vocab, base.logits.begin()));
  EXPECT_NE(q.logits, base.logits);
  EXPECT_NE(full.logits, q.logits);
}

}  // namespace
}  // namespace tandem::testing
