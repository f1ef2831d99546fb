// The CPU forward pass against the independent float32 reference logits shipped with each
// bundled model (../shared/models/*/reference, copied into models/).

#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"

namespace tandem::testing {
namespace {

struct Case {
  std::string model;
  DType weights;
  DType kv;
  double tolerance;
};

class ReferenceLogitsTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceLogitsTest, PrefillThenDecodeMatchesReference) {
  const Case& c = GetParam();
  Reference ref = LoadReference(c.model);
  auto model = Load(c.model, c.weights);
  ASSERT_NE(model, nullptr);
  CpuBackendOptions options;
  options.num_blocks = 16;
  options.kv_dtype = c.kv;
  auto backend = CpuBackend::Create(model, options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const int64_t vocab = (*backend)->vocab_size();
  // Row i holds the logits after feeding sequence[i]; the last generated token is never fed.
  const size_t rows = ref.logits.size() / vocab;
  ASSERT_EQ(rows, ref.sequence.size() - 1);

  // Prompt as one chunk, then one token per step, like generation.
  TestSeq seq;
  seq.tokens = ref.sequence;
  BlockCounter blocks(options.block_size);
  RunStep(**backend, blocks, {{&seq, static_cast<int64_t>(ref.prompt_len)}});
  while (seq.computed < static_cast<int64_t>(seq.tokens.size())) {
    RunStep(**backend, blocks, {{&seq, 1}});
  }
  double worst = 0;
  for (size_t i = 0; i < rows; ++i) {
    double err = RowRelativeError(seq.logits[i].data(), ref.logits.data() + i * vocab, vocab);
    worst = std::max(worst, err);
    EXPECT_LT(err, c.tolerance) << c.model << " position " << i;
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
  std::printf("%s %s: worst row relative error %.3g\n", c.model.c_str(),
              std::string(DTypeName(c.weights)).c_str(), worst);
}

TEST_P(ReferenceLogitsTest, GreedyArgmaxFollowsReference) {
  // With f32 weights the argmax at every step is the reference's next token.
  const Case& c = GetParam();
  if (c.weights != DType::kF32) GTEST_SKIP() << "greedy identity is asserted for f32 weights";
  Reference ref = LoadReference(c.model);
  auto model = Load(c.model, c.weights);
  CpuBackendOptions options;
  options.num_blocks = 16;
  auto backend = CpuBackend::Create(model, options);
  ASSERT_TRUE(backend.ok());
  TestSeq seq;
  seq.tokens = ref.sequence;
  BlockCounter blocks(options.block_size);
  RunStep(**backend, blocks, {{&seq, static_cast<int64_t>(seq.tokens.size())}});
  for (size_t i = ref.prompt_len - 1; i + 1 < ref.sequence.size(); ++i) {
    const auto& row = seq.logits[i];
    int32_t argmax = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    EXPECT_EQ(argmax, ref.sequence[i + 1]) << "position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceLogitsTest,
                         ::testing::Values(Case{"stories260k", DType::kF32, DType::kF32, 1e-4},
                                           Case{"stories260k", DType::kBF16, DType::kF32, 2e-2},
                                           Case{"llama2xs-280k", DType::kF32, DType::kF32, 1e-4},
                                           Case{"llama2xs-280k", DType::kBF16, DType::kF32, 2e-2}),
                         [](const auto& info) {
                           std::string name =
                               info.param.model + "_" + std::string(DTypeName(info.param.weights));
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace tandem::testing
