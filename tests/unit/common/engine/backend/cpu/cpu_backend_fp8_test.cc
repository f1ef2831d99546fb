// fp8 (e4m3) weights on the CPU backend:
// - fp8 checkpoints as published (packed by the independent fp8_checkpoint_packer.py from
//   llama2xs-280k) give logits bit-identical to an f32 checkpoint holding exactly the weights
//   they mean (the kernels dequantize each weight to that same f32 product and reduce as for
//   dense f32 weights), and the same greedy tokens;
// - stories260k quantized to fp8 at load picks the f32 reference's top-1 token at >= 95% of
//   positions (as int8 must) with f32 and with bf16 inputs, and stays batch invariant;
// - int8 MatMul inputs (which only int8 / int4 weights take) are refused with one clear line.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"
#include "tests/unit/common/engine/model/fp8_checkpoint_util.h"

namespace tandem::testing {
namespace {

std::shared_ptr<const Model> LoadDir(const std::string& dir) {
  auto m = LoadModel(dir, LoadOptions());
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::shared_ptr<const Model>(std::move(m).value()) : nullptr;
}

std::unique_ptr<CpuBackend> Backend(const std::shared_ptr<const Model>& model,
                                    DType input = DType::kF32) {
  CpuBackendOptions options;
  options.num_blocks = 64;
  options.matmul_input_dtype = input;
  auto backend = CpuBackend::Create(model, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

// Teacher-forced logits of every position of `tokens`, one prefill step.
std::vector<std::vector<float>> Logits(const std::shared_ptr<const Model>& model,
                                       const std::vector<int32_t>& tokens,
                                       DType input = DType::kF32) {
  auto backend = Backend(model, input);
  if (backend == nullptr) return {};
  BlockCounter blocks(backend->kv_spec().block_size);
  TestSeq seq;
  seq.tokens = tokens;
  RunStep(*backend, blocks, {{&seq, static_cast<int64_t>(tokens.size())}});
  return seq.logits;
}

std::vector<int32_t> Greedy(const std::shared_ptr<const Model>& model, std::vector<int32_t> prompt,
                            int steps) {
  auto backend = Backend(model);
  if (backend == nullptr) return {};
  BlockCounter blocks(backend->kv_spec().block_size);
  TestSeq seq;
  seq.tokens = std::move(prompt);
  std::vector<int32_t> out;
  int64_t chunk = static_cast<int64_t>(seq.tokens.size());
  for (int i = 0; i < steps; ++i) {
    RunStep(*backend, blocks, {{&seq, chunk}});
    const auto& last = seq.logits.back();
    const auto next =
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(next);
    seq.tokens.push_back(next);
    chunk = 1;
  }
  return out;
}

struct Case {
  const char* name;
  const char* args;
};

class Fp8CheckpointBackendTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8CheckpointBackendTest, LogitsAndGreedyMatchTheDequantizedF32Checkpoint) {
  const Case& c = GetParam();
  const auto packed =
      testing_util::PackFp8Checkpoint("llama2xs-280k", c.args, std::string("be_") + c.name);
  auto q = LoadDir(packed.quantized);
  auto ref = LoadDir(packed.dequant);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(ref, nullptr);
  ASSERT_EQ(q->quantization(), WeightQuant::kFp8);
  ASSERT_EQ(ref->quantization(), WeightQuant::kNone);
  const Reference reference = LoadReference("llama2xs-280k");
  const auto got = Logits(q, reference.sequence);
  const auto want = Logits(ref, reference.sequence);
  ASSERT_EQ(got.size(), reference.sequence.size());
  ASSERT_EQ(got.size(), want.size());
  size_t identical = 0;
  for (size_t i = 0; i < got.size(); ++i) identical += got[i] == want[i];
  EXPECT_EQ(identical, got.size()) << "positions bit-identical to the dequantized checkpoint";
  const std::vector<int32_t> prompt(reference.sequence.begin(),
                                    reference.sequence.begin() + reference.prompt_len);
  EXPECT_EQ(Greedy(q, prompt, 24), Greedy(ref, prompt, 24));
}

INSTANTIATE_TEST_SUITE_P(
    Formats, Fp8CheckpointBackendTest,
    ::testing::Values(Case{"ct_channel_bf16", "--format compressed-tensors --dtype bf16"},
                      Case{"ct_tensor_f32", "--format compressed-tensors --strategy tensor"},
                      Case{"fbgemm_f32", "--format fbgemm_fp8"}),
    [](const auto& info) { return std::string(info.param.name); });

// Top-1 agreement of stories260k with `quant` weights made at load against its f32 reference.
double TopOneAgreement(WeightQuant quant, DType input) {
  const Reference ref = LoadReference("stories260k");
  auto model = Load("stories260k", DType::kF32, quant, 128, input);
  EXPECT_EQ(model->quantization(), quant);
  const auto logits = Logits(model, ref.sequence, input);
  const int64_t vocab = model->config().vocab_size;
  const size_t rows = ref.logits.size() / static_cast<size_t>(vocab);
  EXPECT_LE(rows, logits.size());
  int agree = 0;
  double worst = 0;
  for (size_t i = 0; i < rows && i < logits.size(); ++i) {
    const float* want = ref.logits.data() + i * vocab;
    const auto& got = logits[i];
    agree += std::max_element(got.begin(), got.end()) - got.begin() ==
             std::max_element(want, want + vocab) - want;
    worst = std::max(worst, RowRelativeError(got.data(), want, vocab));
  }
  std::printf("stories260k %s inputs %s: top-1 agreement %.4f over %zu, worst row error %.4g\n",
              std::string(WeightQuantName(quant)).c_str(), std::string(DTypeName(input)).c_str(),
              static_cast<double>(agree) / static_cast<double>(rows), rows, worst);
  return static_cast<double>(agree) / static_cast<double>(rows);
}

TEST(Fp8WeightsTest, TopOneAgreementAtLeast95PercentWithF32AndBf16Inputs) {
  for (DType input : {DType::kF32, DType::kBF16}) {
    EXPECT_GE(TopOneAgreement(WeightQuant::kFp8, input), 0.95) << DTypeName(input);
  }
}

TEST(Fp8WeightsTest, Int8InputsRefused) {
  CpuBackendOptions options;
  options.num_blocks = 16;
  options.matmul_input_dtype = DType::kI8;
  auto backend = CpuBackend::Create(Load("stories260k", DType::kF32, WeightQuant::kFp8), options);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(backend.status().message()),
            "MatMul input dtype int8 takes int8 or int4 weights, not fp8 (use auto, f32 or bf16)");
}

TEST(Fp8WeightsTest, BatchInvariantInF32AndBf16Inputs) {
  for (DType input : {DType::kF32, DType::kBF16}) {
    auto model = Load("llama2xs-280k", DType::kBF16, WeightQuant::kFp8, 128, input);
    CpuBackendOptions options;
    options.num_blocks = 512;
    options.kv_dtype = DType::kBF16;
    options.matmul_input_dtype = input;
    ExpectBatchInvariant(model, options);
  }
}

}  // namespace
}  // namespace tandem::testing
