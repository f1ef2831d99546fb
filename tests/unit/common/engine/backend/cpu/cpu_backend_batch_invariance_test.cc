// Batch invariance (DESIGN §4 "Determinism"): a token's logits are bit-identical whichever other
// tokens share the step and however its prompt was chunked.

#include <random>

#include "absl/strings/str_cat.h"

#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::testing {
namespace {

std::vector<int32_t> RandomTokens(std::mt19937& rng, int64_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> dist(3, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = dist(rng);
  return v;
}

// Feeds `seq` in chunks of `chunk` tokens until its prompt is done, then one token per step.
void RunAlone(CpuBackend& backend, BlockCounter& blocks, TestSeq& seq, int64_t prompt_len,
              int64_t chunk) {
  while (seq.computed < prompt_len) {
    RunStep(backend, blocks, {{&seq, std::min(chunk, prompt_len - seq.computed)}});
  }
  while (seq.computed < static_cast<int64_t>(seq.tokens.size())) {
    RunStep(backend, blocks, {{&seq, 1}});
  }
}

struct Case {
  DType weights;
  WeightQuant quant;
  int64_t group;
  DType kv;
};

class BatchInvarianceTest : public ::testing::TestWithParam<Case> {};

TEST_P(BatchInvarianceTest, LogitsIdenticalAloneAndAmongSevenOthers) {
  const Case& c = GetParam();
  auto model = Load("stories260k", c.weights, c.quant, c.group);
  ASSERT_NE(model, nullptr);
  CpuBackendOptions options;
  options.num_blocks = 512;
  options.kv_dtype = c.kv;
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  std::mt19937 rng(1234);

  // The sequence under test: a 37-token prompt and 20 continuation tokens.
  std::vector<int32_t> target = RandomTokens(rng, 57, vocab);
  const int64_t target_prompt = 37;

  auto alone_backend = CpuBackend::Create(model, options);
  ASSERT_TRUE(alone_backend.ok());
  BlockCounter alone_blocks(options.block_size);
  TestSeq alone;
  alone.tokens = target;
  RunAlone(**alone_backend, alone_blocks, alone, target_prompt, target_prompt);

  // Same sequence with prompt chunks of 1, 5 and 16 tokens, each alone: identical logits.
  for (int64_t chunk : {1, 5, 16}) {
    auto b = CpuBackend::Create(model, options);
    BlockCounter counter(options.block_size);
    TestSeq s;
    s.tokens = target;
    RunAlone(**b, counter, s, target_prompt, chunk);
    for (size_t i = 0; i < target.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(s.logits[i].data(), alone.logits[i].data(), vocab * sizeof(float)))
          << "chunk " << chunk << " position " << i;
    }
  }

  // Batched: 7 other sequences of different lengths, joining at different steps, with
  // different chunk sizes; the target's prompt chunked by 7.
  auto batch_backend = CpuBackend::Create(model, options);
  ASSERT_TRUE(batch_backend.ok());
  BlockCounter counter(options.block_size);
  TestSeq t;
  t.tokens = target;
  std::vector<TestSeq> others(7);
  std::vector<int64_t> other_chunk = {3, 11, 64, 1, 9, 24, 2};
  for (size_t k = 0; k < others.size(); ++k) {
    others[k].tokens = RandomTokens(rng, 10 + 13 * static_cast<int64_t>(k), vocab);
  }
  int64_t step = 0;
  while (t.computed < static_cast<int64_t>(t.tokens.size())) {
    std::vector<std::pair<TestSeq*, int64_t>> work;
    for (size_t k = 0; k < others.size(); ++k) {
      TestSeq& o = others[k];
      const int64_t remaining = static_cast<int64_t>(o.tokens.size()) - o.computed;
      if (remaining <= 0 || step < static_cast<int64_t>(k)) continue;  // staggered joins
      work.push_back({&o, std::min(other_chunk[k], remaining)});
    }
    const int64_t chunk =
        t.computed < target_prompt ? std::min<int64_t>(7, target_prompt - t.computed) : 1;
    // Put the target in the middle of the batch.
    work.insert(work.begin() + work.size() / 2, {&t, chunk});
    RunStep(**batch_backend, counter, work);
    ++step;
  }
  for (size_t i = 0; i < target.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(t.logits[i].data(), alone.logits[i].data(), vocab * sizeof(float)))
        << "batched position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Weights, BatchInvarianceTest,
    ::testing::Values(Case{DType::kF32, WeightQuant::kNone, 0, DType::kF32},
                      Case{DType::kBF16, WeightQuant::kNone, 0, DType::kBF16},
                      Case{DType::kF32, WeightQuant::kInt8, 0, DType::kF32},
                      Case{DType::kF32, WeightQuant::kInt4, 32, DType::kF32},
                      Case{DType::kBF16, WeightQuant::kInt4, 128, DType::kBF16},
                      Case{DType::kF32, WeightQuant::kNone, 0, DType::kI8},
                      Case{DType::kBF16, WeightQuant::kNone, 0, DType::kF8E4M3},
                      Case{DType::kBF16, WeightQuant::kInt8, 0, DType::kF8E4M3},
                      Case{DType::kF32, WeightQuant::kInt4, 32, DType::kI8}),
    [](const auto& info) {
      return absl::StrCat(std::string(DTypeName(info.param.weights)), "_",
                          std::string(WeightQuantName(info.param.quant)),
                          info.param.group > 0 ? absl::StrCat("g", info.param.group) : "", "_kv_",
                          std::string(DTypeName(info.param.kv)));
    });

}  // namespace
}  // namespace tandem::testing
