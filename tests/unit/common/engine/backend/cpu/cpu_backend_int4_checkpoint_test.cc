// AWQ / GPTQ int4 checkpoints (packed by the independent tests/.../int4_checkpoint_packer.py from
// llama2xs-280k) served by the CPU backend, against an f32 checkpoint holding exactly the weights
// the quantized one means:
// - without act-order the logits are bit-identical (the kernels dequantize to the same f32
//   values and reduce in the same order as for dense f32 weights);
// - with act-order (GPTQ desc_act) the input is gathered by the permutation and each dot product
//   sums its terms in permuted order, so logits agree to a relative 1e-5 (max |diff| over a row
//   divided by the row's max |logit|) and every greedy token is the same;
// - greedy logits stay bit-identical across batching and chunking, in f32 and bf16.

#include <algorithm>
#include <cstdio>

#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"
#include "tests/unit/common/engine/model/int4_checkpoint_util.h"

namespace tandem::testing {
namespace {

constexpr double kActOrderTolerance = 1e-5;

struct Case {
  const char* name;
  const char* args;
  bool act_order;
};

class Int4CheckpointBackendTest : public ::testing::TestWithParam<Case> {
 protected:
  static std::shared_ptr<const Model> LoadDir(const std::string& dir, bool f32) {
    LoadOptions o;
    o.weight_dtype_auto = !f32;
    o.weight_dtype = DType::kF32;
    auto m = LoadModel(dir, o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::shared_ptr<const Model>(std::move(m).value()) : nullptr;
  }

  // Teacher-forced logits of every position of `tokens`, one prefill step.
  static std::vector<std::vector<float>> Logits(const std::shared_ptr<const Model>& model,
                                                const std::vector<int32_t>& tokens) {
    CpuBackendOptions options;
    options.num_blocks = 64;
    auto backend = CpuBackend::Create(model, options);
    EXPECT_TRUE(backend.ok()) << backend.status();
    BlockCounter blocks(options.block_size);
    TestSeq seq;
    seq.tokens = tokens;
    RunStep(**backend, blocks, {{&seq, static_cast<int64_t>(tokens.size())}});
    return seq.logits;
  }

  // Greedy continuation of `prompt`: prefill, then one token per step.
  static std::vector<int32_t> Greedy(const std::shared_ptr<const Model>& model,
                                     std::vector<int32_t> prompt, int steps) {
    CpuBackendOptions options;
    options.num_blocks = 64;
    auto backend = CpuBackend::Create(model, options);
    EXPECT_TRUE(backend.ok()) << backend.status();
    BlockCounter blocks(options.block_size);
    TestSeq seq;
    seq.tokens = prompt;
    std::vector<int32_t> out;
    int64_t chunk = static_cast<int64_t>(prompt.size());
    for (int i = 0; i < steps; ++i) {
      RunStep(**backend, blocks, {{&seq, chunk}});
      const auto& last = seq.logits.back();
      const int32_t next =
          static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      out.push_back(next);
      seq.tokens.push_back(next);
      chunk = 1;
    }
    return out;
  }
};

TEST_P(Int4CheckpointBackendTest, LogitsAndGreedyMatchTheDequantizedF32Checkpoint) {
  const Case& c = GetParam();
  const auto packed =
      testing_util::PackInt4Checkpoint("llama2xs-280k", c.args, std::string("be_") + c.name);
  auto q = LoadDir(packed.quantized, /*f32=*/true);
  auto ref = LoadDir(packed.dequant, /*f32=*/true);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(ref, nullptr);
  ASSERT_EQ(q->quantization(), WeightQuant::kInt4);
  const Reference reference = LoadReference("llama2xs-280k");
  const auto got = Logits(q, reference.sequence);
  const auto want = Logits(ref, reference.sequence);
  ASSERT_EQ(got.size(), want.size());
  const int64_t vocab = q->config().vocab_size;
  double worst = 0;
  size_t identical = 0, same_top1 = 0, agree_with_f32_model = 0;
  const size_t ref_rows = reference.logits.size() / static_cast<size_t>(vocab);
  for (size_t i = 0; i < got.size(); ++i) {
    identical += got[i] == want[i];
    worst = std::max(worst, RowRelativeError(got[i].data(), want[i].data(), vocab));
    const auto top = [](const std::vector<float>& v) {
      return std::max_element(v.begin(), v.end()) - v.begin();
    };
    same_top1 += top(got[i]) == top(want[i]);
    if (i >= ref_rows) continue;  // the reference has no row for the last token
    const float* orig = reference.logits.data() + i * vocab;
    agree_with_f32_model += top(got[i]) == std::max_element(orig, orig + vocab) - orig;
  }
  std::printf(
      "%s: %zu/%zu positions bit-identical to the dequantized f32 checkpoint, worst row "
      "relative error %.3g; top-1 agreement with the original f32 model %.3f\n",
      c.name, identical, got.size(), worst,
      static_cast<double>(agree_with_f32_model) /
          static_cast<double>(std::min(ref_rows, got.size())));
  if (c.act_order) {
    EXPECT_LE(worst, kActOrderTolerance);
    EXPECT_EQ(same_top1, got.size());
  } else {
    EXPECT_EQ(identical, got.size());
  }
  const std::vector<int32_t> prompt(reference.sequence.begin(),
                                    reference.sequence.begin() + reference.prompt_len);
  EXPECT_EQ(Greedy(q, prompt, 24), Greedy(ref, prompt, 24));
}

TEST_P(Int4CheckpointBackendTest, BatchInvariantInF32AndBf16) {
  const Case& c = GetParam();
  const auto packed =
      testing_util::PackInt4Checkpoint("llama2xs-280k", c.args, std::string("bi_") + c.name);
  for (bool f32 : {true, false}) {
    auto model = LoadDir(packed.quantized, f32);
    ASSERT_NE(model, nullptr);
    ASSERT_EQ(model->weight_dtype(), f32 ? DType::kF32 : DType::kBF16);  // auto: f16 -> bf16
    CpuBackendOptions options;
    options.num_blocks = 512;
    options.kv_dtype = model->weight_dtype();
    ExpectBatchInvariant(model, options);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, Int4CheckpointBackendTest,
    ::testing::Values(Case{"awq_g32", "--format awq --group 32", false},
                      Case{"gptq_sym_g64", "--format gptq --group 64 --sym", false},
                      Case{"gptq_act_g32", "--format gptq --group 32 --act-order", true},
                      Case{"gptq_per_channel", "--format gptq --group -1", false}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::testing
