// fp8 checkpoints as published (compressed-tensors "float-quantized", fbgemm_fp8, vLLM's fp8):
// the loaded fp8 tensors dequantize exactly to the weights the independent Python packer says the
// checkpoint means (per-channel and per-tensor scales, f32 and bf16 checkpoints), model ids tell
// the formats apart, and unsupported variants and damaged files are refused with one line naming
// the field or tensor.

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine/model/fp8_checkpoint.h"
#include "common/engine/model/model.h"
#include "common/engine/model/quant_config.h"
#include "common/engine/model/quantize.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/common/engine/model/fp8_checkpoint_util.h"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing_util::EditHeader;
using testing_util::HeaderLength;
using testing_util::PackFp8Checkpoint;
using testing_util::ReadFile;
using testing_util::ScratchDir;
using testing_util::WriteFile;

constexpr char kModel[] = "llama2xs-280k";  // hidden 64, ffn 192, 5 layers, tied embeddings

std::unique_ptr<Model> LoadAuto(const std::string& dir) {
  auto m = LoadModel(dir, LoadOptions());
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<Model> LoadF32(const std::string& dir) {
  LoadOptions o;
  o.weight_dtype_auto = false;
  o.weight_dtype = DType::kF32;
  auto m = LoadModel(dir, o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<const Tensor*> Projections(const LayerWeights& l) {
  return {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj};
}

struct Case {
  const char* name;
  const char* args;
  const char* id_suffix;
  CheckpointQuantMethod method;
  bool per_tensor;
  DType weight_dtype;  // of the dense tensors as loaded by auto
};

class Fp8CheckpointTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8CheckpointTest, DequantizesExactlyToThePackersWeights) {
  const Case& c = GetParam();
  const auto packed = PackFp8Checkpoint(kModel, c.args, c.name);
  auto q = LoadAuto(packed.quantized);
  auto ref = LoadF32(packed.dequant);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(q->quantization(), WeightQuant::kFp8);
  EXPECT_EQ(q->quant_layout(), WeightLayout::kRows);
  EXPECT_EQ(q->checkpoint_quant().method, c.method);
  EXPECT_EQ(q->checkpoint_quant().per_tensor, c.per_tensor);
  EXPECT_EQ(q->weight_dtype(), c.weight_dtype);
  EXPECT_THAT(q->model_id(), HasSubstr(absl::StrCat(c.id_suffix, "-")));
  EXPECT_NE(q->model_id(), ref->model_id());

  const ModelConfig& cfg = q->config();
  size_t mismatches = 0, expected_bytes = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const auto got = Projections(q->weights().layers[l]);
    const auto want = Projections(ref->weights().layers[l]);
    for (size_t p = 0; p < got.size(); ++p) {
      const Tensor& t = *got[p];
      const Tensor& r = *want[p];
      ASSERT_EQ(t.quant, WeightQuant::kFp8);
      ASSERT_EQ(t.layout, WeightLayout::kRows);
      ASSERT_EQ(t.shape, r.shape);
      ASSERT_NE(t.scales, nullptr);
      const int64_t N = t.rows(), K = t.cols();
      expected_bytes += static_cast<size_t>(N * (K + 4));
      std::vector<float> row(K);
      for (int64_t n = 0; n < N; ++n) {
        if (c.per_tensor) EXPECT_EQ(t.scales[n], t.scales[0]) << "per-tensor scale expanded";
        DequantizeRow(WeightQuant::kFp8, t.as<uint8_t>() + n * K, t.scales + n, nullptr, K, 0,
                      row.data());
        mismatches += std::memcmp(row.data(), r.as<float>() + n * K, K * 4) != 0;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "rows that differ from the packer's dequantized weights";
  EXPECT_EQ(q->weights().lm_head.quant, WeightQuant::kNone) << "tied lm_head stays dense";
  expected_bytes += q->weights().lm_head.nbytes() +
                    static_cast<size_t>(cfg.hidden_size) * DTypeSize(c.weight_dtype);
  EXPECT_EQ(q->decode_weight_bytes(), expected_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, Fp8CheckpointTest,
    ::testing::Values(Case{"ct_channel_bf16", "--format compressed-tensors --dtype bf16",
                           "-compressed-tensors-fp8", CheckpointQuantMethod::kCompressedTensorsFp8,
                           false, DType::kBF16},
                      Case{"ct_tensor_f32",
                           "--format compressed-tensors --strategy tensor --dtype f32",
                           "-compressed-tensors-fp8t", CheckpointQuantMethod::kCompressedTensorsFp8,
                           true, DType::kF32},
                      Case{"fbgemm_bf16", "--format fbgemm_fp8 --dtype bf16", "-fbgemm_fp8-fp8",
                           CheckpointQuantMethod::kFbgemmFp8, false, DType::kBF16},
                      Case{"vllm_fp8_tensor", "--format fp8 --strategy tensor --dtype bf16",
                           "-fp8-fp8t", CheckpointQuantMethod::kFp8, true, DType::kBF16}),
    [](const auto& info) { return std::string(info.param.name); });

absl::StatusOr<CheckpointQuantConfig> Parse(const std::string& json) {
  return ParseCheckpointQuantConfig(nlohmann::json::parse(json), "config.json", false);
}

// A compressed-tensors FP8-dynamic config as llm-compressor writes it, with one field changed.
std::string CompressedTensors(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json q = nlohmann::json::parse(R"({
    "quant_method": "compressed-tensors", "format": "float-quantized",
    "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": null,
    "config_groups": {"group_0": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
                  "dynamic": false, "group_size": null, "block_structure": null},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                            "symmetric": true, "dynamic": true},
      "output_activations": null}}})");
  edit(q);
  return q.dump();
}

TEST(Fp8QuantConfigTest, AcceptsThePublishedSchemes) {
  auto ct = Parse(CompressedTensors([](auto&) {}));
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_TRUE(ct->fp8());
  EXPECT_EQ(ct->bits, 8);
  EXPECT_FALSE(ct->per_tensor);
  auto st = Parse(CompressedTensors([](auto& q) {  // FP8 static: per-tensor weights and inputs
    q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor";
    q["config_groups"]["group_0"]["input_activations"]["strategy"] = "tensor";
    q["config_groups"]["group_0"]["input_activations"]["dynamic"] = false;
  }));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(st->per_tensor);
  auto wo = Parse(CompressedTensors([](auto& q) {  // weight-only
    q["config_groups"]["group_0"]["input_activations"] = nullptr;
  }));
  EXPECT_TRUE(wo.ok()) << wo.status();
  auto fb = Parse(R"({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                      "modules_to_not_convert": ["lm_head"]})");
  ASSERT_TRUE(fb.ok()) << fb.status();
  EXPECT_EQ(fb->method, CheckpointQuantMethod::kFbgemmFp8);
  auto v = Parse(R"({"quant_method": "fp8", "activation_scheme": "static"})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->method, CheckpointQuantMethod::kFp8);
  EXPECT_TRUE(v->per_tensor);
}

TEST(Fp8QuantConfigTest, RefusesUnsupportedVariantsNamingTheField) {
  struct Bad {
    std::string json;
    std::string expected;
  };
  auto group = [](const char* key, nlohmann::json value) {
    return CompressedTensors(
        [&](auto& q) { q["config_groups"]["group_0"]["weights"][key] = value; });
  };
  const Bad bads[] = {
      {group("strategy", "block"), "weights.strategy 'block' is not supported"},
      {group("strategy", "group"), "weights.strategy 'group' is not supported"},
      {group("block_structure", nlohmann::json::array({128, 128})),
       "weights.block_structure (block-wise scales)"},
      {group("num_bits", 4), "weights: num_bits 4 type 'float' is not supported"},
      {group("type", "int"), "weights: num_bits 8 type 'int' is not supported"},
      {group("dynamic", true), "weights.dynamic true"},
      {group("symmetric", false), "weights.symmetric false"},
      {CompressedTensors(
           [](auto& q) { q["config_groups"]["group_0"]["input_activations"]["type"] = "int"; }),
       "input_activations: num_bits 8 type 'int' is not supported"},
      {CompressedTensors([](auto& q) {
         q["config_groups"]["group_0"]["input_activations"]["strategy"] = "group";
       }),
       "input_activations.strategy 'group' is not supported"},
      {CompressedTensors([](auto& q) {
         q["config_groups"]["group_0"]["output_activations"] =
             q["config_groups"]["group_0"]["input_activations"];
       }),
       "output_activations is not supported"},
      {CompressedTensors([](auto& q) { q["format"] = "pack-quantized"; }),
       "compressed-tensors format 'pack-quantized' is not supported"},
      {CompressedTensors([](auto& q) { q["quantization_status"] = "frozen"; }),
       "quantization_status 'frozen'"},
      {CompressedTensors([](auto& q) {
         q["kv_cache_scheme"] = {{"num_bits", 8}};
       }),
       "kv_cache_scheme is not supported"},
      {CompressedTensors(
           [](auto& q) { q["config_groups"]["group_1"] = q["config_groups"]["group_0"]; }),
       "config_groups: 2 groups"},
      {R"({"quant_method": "fp8", "weight_block_size": [128, 128]})",
       "fp8 weight_block_size (block-wise scales) is not supported"},
      {R"({"quant_method": "fp8", "activation_scheme": "whatever"})",
       "activation_scheme 'whatever'"},
      {R"({"quant_method": "modelopt"})", "quant_method 'modelopt' is not supported"},
  };
  for (const Bad& b : bads) {
    auto c = Parse(b.json);
    ASSERT_FALSE(c.ok()) << b.json;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(b.expected)) << b.json;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("config.json"));
    EXPECT_EQ(std::string(c.status().message()).find('\n'), std::string::npos);
  }
}

class Fp8CheckpointErrorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    packed_ = new testing_util::PackedCheckpoint(
        PackFp8Checkpoint(kModel, "--format compressed-tensors --dtype bf16", "errors"));
  }
  static void TearDownTestSuite() {
    delete packed_;
    packed_ = nullptr;
  }
  void SetUp() override {
    std::filesystem::copy(packed_->quantized, dir_.path(),
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::overwrite_existing);
  }
  std::string weights() const { return dir_.file("model.safetensors"); }

  // Overwrites bytes [offset, offset + bytes.size()) of tensor `name`'s data.
  void PatchData(const std::string& name, size_t offset, const std::string& bytes) {
    std::string file = ReadFile(weights());
    const uint64_t n = HeaderLength(file);
    const nlohmann::json h = nlohmann::json::parse(file.substr(8, n));
    const size_t begin = 8 + n + h[name]["data_offsets"][0].get<size_t>() + offset;
    file.replace(begin, bytes.size(), bytes);
    WriteFile(weights(), file);
  }

  void ExpectError(std::initializer_list<std::string> parts, LoadOptions options = LoadOptions()) {
    absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir_.path(), options);
    ASSERT_FALSE(m.ok());
    for (const std::string& part : parts) {
      EXPECT_THAT(std::string(m.status().message()), HasSubstr(part));
    }
  }

  static testing_util::PackedCheckpoint* packed_;
  ScratchDir dir_{"fp8"};
};

testing_util::PackedCheckpoint* Fp8CheckpointErrorsTest::packed_ = nullptr;

const char kQ[] = "model.layers.0.self_attn.q_proj.";

TEST_F(Fp8CheckpointErrorsTest, TheUndamagedCheckpointLoadsAlsoWithQuantizationFp8) {
  EXPECT_TRUE(LoadModel(dir_.path(), LoadOptions()).ok());
  LoadOptions o;
  o.quantization = WeightQuant::kFp8;
  auto m = LoadModel(dir_.path(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->weights().lm_head.quant, WeightQuant::kFp8) << "dense lm_head quantized too";
  o.quantization = WeightQuant::kInt8;
  ExpectError({"is already quantized (compressed-tensors fp8", "quantization int8"}, o);
}

TEST_F(Fp8CheckpointErrorsTest, BadScalesAndCodes) {
  // Block-wise scales (here [N / 2, 2], the same bytes) are not per channel or per tensor.
  EditHeader(weights(), [](nlohmann::json& h) {
    h[std::string(kQ) + "weight_scale"]["shape"] = {32, 2};
  });
  ExpectError({weights(), "q_proj.weight_scale' must be F32, BF16 or F16 of shape [64]",
               "block-wise scales are not supported"});
  SetUp();
  PatchData(std::string(kQ) + "weight", 3 * 64 + 5, std::string(1, '\x7f'));
  ExpectError({weights(), "q_proj.weight' holds a NaN code at row 3, column 5"});
  SetUp();
  PatchData(std::string(kQ) + "weight_scale", 2, std::string("\x80\xbf", 2));  // bf16 -1
  ExpectError({weights(), "q_proj.weight_scale' holds -1 at 1"});
  SetUp();
  EditHeader(weights(), [](nlohmann::json& h) { h.erase(std::string(kQ) + "weight_scale"); });
  ExpectError({"q_proj.weight_scale"});
}

}  // namespace
}  // namespace tandem
