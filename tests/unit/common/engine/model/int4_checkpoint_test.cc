// AWQ / GPTQ int4 checkpoints: the loaded int4 tensors dequantize exactly to the weights the
// independent Python packer says the checkpoint means, model ids and decode bytes tell them apart,
// and bad or unsupported files are clear errors (naming the file and tensor), never crashes.

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/engine/model/model.h"
#include "common/engine/model/quant_config.h"
#include "common/engine/model/quantize.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/common/engine/model/int4_checkpoint_util.h"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing_util::EditHeader;
using testing_util::HeaderLength;
using testing_util::PackInt4Checkpoint;
using testing_util::ReadFile;
using testing_util::ScratchDir;
using testing_util::WriteFile;

constexpr char kModel[] = "llama2xs-280k";  // hidden 64, ffn 192, 5 layers, tied embeddings

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
  int64_t group;
  bool act_order;
  float zero00 = -1;  // expected zero point of layer 0 q_proj [0, 0] (-1: not checked)
  bool dense_down_proj = false;
};

class Int4CheckpointTest : public ::testing::TestWithParam<Case> {};

TEST_P(Int4CheckpointTest, DequantizesExactlyToThePackersWeights) {
  const Case& c = GetParam();
  const auto packed = PackInt4Checkpoint(kModel, c.args, c.name);
  auto q = LoadF32(packed.quantized);
  auto ref = LoadF32(packed.dequant);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(q->quantization(), WeightQuant::kInt4);
  EXPECT_TRUE(q->checkpoint_quant().quantized());
  EXPECT_FALSE(ref->checkpoint_quant().quantized());
  EXPECT_THAT(q->model_id(), HasSubstr(absl::StrCat("-f32", c.id_suffix, "-")));
  EXPECT_NE(q->model_id(), ref->model_id());

  const ModelConfig& cfg = q->config();
  size_t expected_bytes = static_cast<size_t>(cfg.vocab_size * cfg.hidden_size * 4 +  // lm_head
                                              cfg.hidden_size * 4);  // one embedding row
  size_t mismatches = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const auto got = Projections(q->weights().layers[l]);
    const auto want = Projections(ref->weights().layers[l]);
    for (size_t p = 0; p < got.size(); ++p) {
      const Tensor& t = *got[p];
      const Tensor& r = *want[p];
      if (c.dense_down_proj && p == 6) {  // modules_to_not_convert: stored f16, loaded dense
        ASSERT_EQ(t.quant, WeightQuant::kNone);
        EXPECT_EQ(0, std::memcmp(t.data, r.data, r.nbytes()));
        expected_bytes += r.nbytes();
        continue;
      }
      ASSERT_EQ(t.quant, WeightQuant::kInt4);
      ASSERT_EQ(r.quant, WeightQuant::kNone);
      ASSERT_EQ(t.shape, r.shape);
      int64_t group = c.group, kernel_group = c.group;
      if (c.group == -1) {  // one group per row; the kernels' group is a power of two >= K
        group = t.cols();
        for (kernel_group = 32; kernel_group < group;) kernel_group *= 2;
      }
      ASSERT_EQ(t.group_size, kernel_group);
      const int64_t N = t.rows(), K = t.cols(), G = K / group;
      // A single group (K == group) has nothing to permute.
      ASSERT_EQ(t.input_perm != nullptr, c.act_order && G > 1) << "layer " << l << " proj " << p;
      expected_bytes += static_cast<size_t>(N * (K / 2 + G * 8) + (t.input_perm ? K * 4 : 0));
      std::vector<float> row(K), unpermuted(K);
      for (int64_t n = 0; n < N; ++n) {
        DequantizeRow(WeightQuant::kInt4, t.as<uint8_t>() + n * Int4RowBytes(K), t.scales + n * G,
                      t.zeros + n * G, K, t.group_size, row.data());
        for (int64_t j = 0; j < K; ++j) {
          unpermuted[t.input_perm != nullptr ? t.input_perm[j] : j] = row[j];
        }
        mismatches += std::memcmp(unpermuted.data(), r.as<float>() + n * K, K * 4) != 0;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "rows that differ from the packer's dequantized weights";
  if (c.zero00 >= 0) {  // --force-zero0: layer 0 q_proj row 0 group 0 had zero point 0
    EXPECT_EQ(q->weights().layers[0].q_proj.zeros[0], c.zero00)
        << "GPTQ v1 stores zero point 0 as 15, which means 16; v2 stores it as is";
  }
  const Tensor& embed = q->weights().embed_tokens;
  EXPECT_EQ(0, std::memcmp(embed.data, ref->weights().embed_tokens.data, embed.nbytes()));
  EXPECT_EQ(q->weights().lm_head.quant, WeightQuant::kNone) << "tied lm_head stays dense";
  EXPECT_EQ(q->decode_weight_bytes(), expected_bytes);
  EXPECT_LT(q->decode_weight_bytes(), ref->decode_weight_bytes());
}

INSTANTIATE_TEST_SUITE_P(
    Formats, Int4CheckpointTest,
    ::testing::Values(
        Case{"awq_g32", "--format awq --group 32", "-awq-g32", 32, false},
        Case{"awq_g64", "--format awq --group 64", "-awq-g64", 64, false},
        Case{"gptq_g32", "--format gptq --group 32 --force-zero0", "-gptq-g32", 32, false, 16},
        Case{"gptq_sym_g64", "--format gptq --group 64 --sym", "-gptq-g64", 64, false},
        Case{"gptq_v2_g32", "--format gptq --group 32 --gptq-version 2 --force-zero0", "-gptq-g32",
             32, false, 0},
        Case{"gptq_act_g32", "--format gptq --group 32 --act-order", "-gptq-g32-act", 32, true},
        Case{"gptq_sym_act_g64_quantize_config",
             "--format gptq --group 64 --sym --act-order --quantize-config-json", "-gptq-g64-act",
             64, true},
        Case{"gptq_per_channel", "--format gptq --group -1", "-gptq-gch", -1, false},
        Case{"awq_dense_down_proj", "--format awq --group 32 --dense mlp.down_proj", "-awq-g32", 32,
             false, -1, true}),
    [](const auto& info) { return std::string(info.param.name); });

// AutoAWQ's own spellings (w_bit, q_group_size, "GEMM") and AutoGPTQ's defaults.
TEST(CheckpointQuantConfigTest, AcceptsBothSpellingsAndDefaults) {
  auto awq = ParseCheckpointQuantConfig(
      nlohmann::json::parse(
          R"({"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "version": "GEMM"})"),
      "c.json", false);
  ASSERT_TRUE(awq.ok()) << awq.status();
  EXPECT_EQ(awq->method, CheckpointQuantMethod::kAwq);
  EXPECT_EQ(awq->group_size, 128);
  EXPECT_EQ(awq->IdSuffix(), "-awq-g128");
  auto gptq = ParseCheckpointQuantConfig(nlohmann::json::parse(R"({"bits": 4, "group_size": 32})"),
                                         "quantize_config.json", true);
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  EXPECT_EQ(gptq->method, CheckpointQuantMethod::kGptq);
  EXPECT_TRUE(gptq->sym);
  EXPECT_FALSE(gptq->desc_act);
  EXPECT_EQ(gptq->gptq_version, 1);
  auto v2 = ParseCheckpointQuantConfig(
      nlohmann::json::parse(R"({"quant_method": "GPTQ", "bits": 4, "group_size": -1,
                                "desc_act": true, "checkpoint_format": "gptq_v2"})"),
      "c.json", false);
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->gptq_version, 2);
  EXPECT_EQ(v2->IdSuffix(), "-gptq-gch-act");
}

// Damaged or unsupported checkpoints, each made from a freshly packed one.
class Int4CheckpointErrorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    awq_ = new testing_util::PackedCheckpoint(
        PackInt4Checkpoint(kModel, "--format awq --group 32", "errors_awq"));
    gptq_ = new testing_util::PackedCheckpoint(
        PackInt4Checkpoint(kModel, "--format gptq --group 32 --act-order", "errors_gptq"));
  }
  static void TearDownTestSuite() {
    delete awq_;
    delete gptq_;
  }

  // A private copy of the AWQ or GPTQ checkpoint.
  void Use(bool awq) {
    std::filesystem::copy((awq ? awq_ : gptq_)->quantized, dir_.path(),
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::overwrite_existing);
  }
  std::string weights() const { return dir_.file("model.safetensors"); }
  std::string config() const { return dir_.file("config.json"); }

  void EditQuantConfig(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = nlohmann::json::parse(ReadFile(config()));
    edit(c["quantization_config"]);
    WriteFile(config(), c.dump());
  }

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

  static testing_util::PackedCheckpoint* awq_;
  static testing_util::PackedCheckpoint* gptq_;
  ScratchDir dir_{"int4"};
};

testing_util::PackedCheckpoint* Int4CheckpointErrorsTest::awq_ = nullptr;
testing_util::PackedCheckpoint* Int4CheckpointErrorsTest::gptq_ = nullptr;

const char kQ[] = "model.layers.0.self_attn.q_proj.";

std::string Int32Bytes(int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

TEST_F(Int4CheckpointErrorsTest, TheUndamagedCheckpointsLoad) {
  for (bool awq : {true, false}) {
    Use(awq);
    EXPECT_TRUE(LoadModel(dir_.path(), LoadOptions()).ok());
  }
}

TEST_F(Int4CheckpointErrorsTest, UnsupportedSettings) {
  struct Edit {
    bool awq;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> expected;
  };
  const Edit edits[] = {
      {true, [](auto& q) { q["version"] = "gemv"; }, {"AWQ version 'gemv' is not supported"}},
      {true, [](auto& q) { q["version"] = "marlin"; }, {"AWQ version 'marlin'"}},
      {true, [](auto& q) { q["zero_point"] = false; }, {"zero_point false"}},
      {true, [](auto& q) { q["bits"] = 8; }, {"awq with bits 8 is not supported"}},
      {false, [](auto& q) { q["bits"] = 3; }, {"gptq with bits 3 is not supported"}},
      {true, [](auto& q) { q.erase("bits"); }, {"'bits' missing"}},
      {true,
       [](auto& q) { q["quant_method"] = "bitsandbytes"; },
       {"quant_method 'bitsandbytes' is not supported"}},
      {true, [](auto& q) { q.erase("quant_method"); }, {"no 'quant_method'"}},
      {false,
       [](auto& q) { q["checkpoint_format"] = "marlin"; },
       {"checkpoint_format 'marlin' is not supported"}},
      {false, [](auto& q) { q["group_size"] = 48; }, {"group_size 48 is not supported"}},
      {true, [](auto& q) { q["group_size"] = -1; }, {"group_size -1 is not supported"}},
      {false,
       [](auto& q) { q["group_size"] = 128; },
       {"tensor 'model.layers.0.self_attn.q_proj.qweight'", "not a multiple of group_size 128"}},
      {false, [](auto& q) { q["sym"] = "yes"; }, {"sym"}},
      {false,
       [](auto& q) { q["sym"] = true; },
       {"tensor 'model.layers.0.self_attn.q_proj.qzeros'", "says sym (zero point 8)"}},
  };
  for (const Edit& e : edits) {
    Use(e.awq);
    EditQuantConfig(e.edit);
    absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir_.path(), LoadOptions());
    ASSERT_FALSE(m.ok()) << e.expected[0];
    EXPECT_THAT(m.status().message(), HasSubstr(config()));
    for (const std::string& part : e.expected) EXPECT_THAT(m.status().message(), HasSubstr(part));
  }
  Use(true);
  nlohmann::json c = nlohmann::json::parse(ReadFile(config()));
  c["quantization_config"] = "awq";
  WriteFile(config(), c.dump());
  ExpectError({config(), "not a JSON object"});
}

TEST_F(Int4CheckpointErrorsTest, WrongDtypes) {
  Use(true);
  EditHeader(weights(), [](nlohmann::json& h) { h[std::string(kQ) + "qweight"]["dtype"] = "F32"; });
  ExpectError({weights(),
               "tensor 'model.layers.0.self_attn.q_proj.qweight' has dtype F32, "
               "expected I32"});
  Use(true);
  EditHeader(weights(), [](nlohmann::json& h) {
    auto& s = h[std::string(kQ) + "scales"];
    s["dtype"] = "I32";
    s["shape"] = {2, 32};  // same bytes as F16 [2, 64]
  });
  ExpectError({weights(), "q_proj.scales' has dtype I32, expected F16 or BF16"});
  Use(false);
  EditHeader(weights(), [](nlohmann::json& h) { h[std::string(kQ) + "g_idx"]["dtype"] = "F32"; });
  ExpectError({weights(), "q_proj.g_idx' has dtype F32, expected I32"});
  Use(true);  // a dense tensor stored as I32
  EditHeader(weights(), [](nlohmann::json& h) {
    auto& e = h["model.norm.weight"];
    e["dtype"] = "I32";
    e["shape"] = {32};
  });
  ExpectError({weights(), "tensor 'model.norm.weight' has unsupported dtype 'I32'"});
}

TEST_F(Int4CheckpointErrorsTest, WrongShapesAndMissingTensors) {
  Use(true);  // AWQ qweight is [in, out/8] = [64, 8]
  EditHeader(weights(), [](nlohmann::json& h) {
    h[std::string(kQ) + "qweight"]["shape"] = {8, 64};
  });
  ExpectError({weights(), "q_proj.qweight' has shape [8, 64], expected [64, 8]"});
  Use(false);  // GPTQ qzeros [in/group, out/8] = [2, 8]
  EditHeader(weights(), [](nlohmann::json& h) {
    h[std::string(kQ) + "qzeros"]["shape"] = {1, 16};
  });
  ExpectError({weights(), "q_proj.qzeros' has shape [1, 16], expected [2, 8]"});
  Use(true);
  EditHeader(weights(), [](nlohmann::json& h) { h.erase("model.layers.3.mlp.down_proj.qzeros"); });
  ExpectError({"model.layers.3.mlp.down_proj.qzeros"});
  Use(true);  // neither qweight nor weight
  EditHeader(weights(), [](nlohmann::json& h) { h.erase("model.layers.1.mlp.up_proj.qweight"); });
  ExpectError({"model.layers.1.mlp.up_proj.qweight"});
  Use(false);  // desc_act needs g_idx
  EditHeader(weights(), [](nlohmann::json& h) { h.erase(std::string(kQ) + "g_idx"); });
  ExpectError({"model.layers.0.self_attn.q_proj.g_idx"});
  Use(true);  // truncated: the parser's bounds check
  std::filesystem::resize_file(weights(), std::filesystem::file_size(weights()) - 100);
  ExpectError({weights(), "truncated"});
}

TEST_F(Int4CheckpointErrorsTest, BadValues) {
  Use(false);
  PatchData(std::string(kQ) + "g_idx", 4 * 5, Int32Bytes(7));
  ExpectError({weights(), "q_proj.g_idx' holds group 7 at input channel 5, outside [0, 2)"});
  Use(false);  // every channel in group 0: in range, but group 0 would hold 64 channels
  PatchData(std::string(kQ) + "g_idx", 0, std::string(64 * 4, '\0'));
  ExpectError({weights(), "q_proj.g_idx' does not give every group exactly 32 input channels"});
  Use(true);
  PatchData(std::string(kQ) + "scales", 2 * 3, std::string("\x00\x7c", 2));  // f16 +inf
  ExpectError({weights(), "q_proj.scales' holds a non-finite scale at [0, 3]"});
}

TEST_F(Int4CheckpointErrorsTest, QuantizationAtLoadIsRefused) {
  Use(true);
  LoadOptions o;
  o.quantization = WeightQuant::kInt4;
  ExpectError({"is already quantized (awq int4", "use none"}, o);
  Use(false);
  o.quantization = WeightQuant::kInt8;
  ExpectError({"is already quantized (gptq int4", "quantization int8"}, o);
}

}  // namespace
}  // namespace tandem
