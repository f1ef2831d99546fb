// Damaged model directories: every failure is a status naming the file (and tensor), not a crash.

#include <filesystem>

#include "common/engine/model/model.h"
#include "common/engine/model/model_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing_util::EditHeader;
using testing_util::ReadFile;
using testing_util::ScratchDir;
using testing_util::WriteFile;

class ModelErrorsTest : public ::testing::Test {
 protected:
  // A small untied f32 Llama: embed [512, 64], 2 layers, ffn 176, GQA 4/2.
  void WriteModel(int64_t max_shard_bytes = 0, Architecture arch = Architecture::kLlama) {
    RandomModelOptions o;
    o.config = *RandomModelPresetConfig("tiny");
    o.config->architecture = arch;
    o.config->model_type = "";
    o.config->tie_word_embeddings = false;
    o.config->vocab_size = 512;
    o.dtype = DType::kF32;
    o.max_shard_bytes = max_shard_bytes;
    ASSERT_TRUE(WriteRandomModel(o, dir_.path()).ok());
    ASSERT_TRUE(LoadModel(dir_.path(), LoadOptions()).ok()) << "the undamaged model loads";
  }

  // Loads the damaged model and checks that the error names every one of `parts`.
  void ExpectError(std::initializer_list<std::string> parts) {
    absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir_.path(), LoadOptions());
    ASSERT_FALSE(m.ok());
    for (const std::string& part : parts) {
      EXPECT_THAT(m.status().message(), HasSubstr(part));
    }
  }

  std::string weights() const { return dir_.file("model.safetensors"); }

  ScratchDir dir_{"model"};
};

TEST_F(ModelErrorsTest, TruncatedFile) {
  WriteModel();
  std::filesystem::resize_file(weights(), std::filesystem::file_size(weights()) - 10);
  ExpectError({weights(), "tensor 'lm_head.weight'", "truncated"});
}

TEST_F(ModelErrorsTest, HeaderLengthBeyondFile) {
  WriteModel();
  std::filesystem::resize_file(weights(), 100);
  ExpectError({weights(), "header length", "beyond the file size of 100 bytes"});
}

TEST_F(ModelErrorsTest, FileShorterThanTheLengthField) {
  WriteModel();
  std::filesystem::resize_file(weights(), 5);
  ExpectError({weights(), "too short"});
}

TEST_F(ModelErrorsTest, HugeHeaderLength) {
  WriteModel();
  std::string bytes = ReadFile(weights());
  WriteFile(weights(), testing_util::EncodeLength(0xffffffffffffff00ull) + bytes.substr(8));
  ExpectError({weights(), "header length 18446744073709551360 exceeds the limit"});
}

TEST_F(ModelErrorsTest, WrongShape) {
  WriteModel();
  EditHeader(weights(), [](nlohmann::json& h) {
    h["model.layers.1.mlp.gate_proj.weight"]["shape"] = {64, 176};
  });
  ExpectError({weights(), "tensor 'model.layers.1.mlp.gate_proj.weight'",
               "shape [64, 176], expected [176, 64]"});
}

TEST_F(ModelErrorsTest, ConfigDisagreesWithTheWeights) {
  WriteModel();
  nlohmann::json config = nlohmann::json::parse(ReadFile(dir_.file("config.json")));
  config["vocab_size"] = 600;
  WriteFile(dir_.file("config.json"), config.dump());
  ExpectError({weights(), "tensor 'model.embed_tokens.weight'", "expected [600, 64]"});
}

TEST_F(ModelErrorsTest, MissingTensor) {
  WriteModel();
  EditHeader(weights(),
             [](nlohmann::json& h) { h.erase("model.layers.0.self_attn.v_proj.weight"); });
  ExpectError({weights(), "missing tensor 'model.layers.0.self_attn.v_proj.weight'"});
}

TEST_F(ModelErrorsTest, MissingLmHeadWhenUntied) {
  WriteModel();
  EditHeader(weights(), [](nlohmann::json& h) { h.erase("lm_head.weight"); });
  ExpectError({weights(), "missing tensor 'lm_head.weight'"});
}

TEST_F(ModelErrorsTest, MissingQwen2Bias) {
  WriteModel(0, Architecture::kQwen2);
  EditHeader(weights(), [](nlohmann::json& h) { h.erase("model.layers.1.self_attn.v_proj.bias"); });
  ExpectError({weights(), "missing tensor 'model.layers.1.self_attn.v_proj.bias'"});
}

TEST_F(ModelErrorsTest, UnsupportedDtype) {
  WriteModel();
  EditHeader(weights(), [](nlohmann::json& h) { h["model.norm.weight"]["dtype"] = "I32"; });
  ExpectError({weights(), "tensor 'model.norm.weight'", "unsupported dtype 'I32'"});
}

TEST_F(ModelErrorsTest, BadHeaderJson) {
  WriteModel();
  std::string bytes = ReadFile(weights());
  bytes[9] = '!';  // just after the opening brace
  WriteFile(weights(), bytes);
  ExpectError({weights(), "invalid JSON"});
}

TEST_F(ModelErrorsTest, OverlappingOffsets) {
  WriteModel();
  EditHeader(weights(), [](nlohmann::json& h) {
    const uint64_t q = h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"][0];
    h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"] = {q, q + 32 * 64 * 4};
  });
  ExpectError({weights(), "model.layers.0.self_attn.q_proj.weight",
               "model.layers.0.self_attn.k_proj.weight", "overlap"});
}

TEST_F(ModelErrorsTest, ReversedOffsets) {
  WriteModel();
  EditHeader(weights(), [](nlohmann::json& h) {
    h["model.norm.weight"]["data_offsets"] = {256, 0};
  });
  ExpectError({weights(), "tensor 'model.norm.weight'", "invalid data_offsets [256, 0]"});
}

TEST_F(ModelErrorsTest, BadConfigJson) {
  WriteModel();
  WriteFile(dir_.file("config.json"), "{\"architectures\": [");
  ExpectError({dir_.file("config.json"), "invalid JSON"});
}

TEST_F(ModelErrorsTest, UnsupportedArchitecture) {
  WriteModel();
  nlohmann::json config = nlohmann::json::parse(ReadFile(dir_.file("config.json")));
  config["architectures"] = {"GPT2LMHeadModel"};
  WriteFile(dir_.file("config.json"), config.dump());
  ExpectError({dir_.file("config.json"), "unsupported architecture 'GPT2LMHeadModel'"});
}

TEST_F(ModelErrorsTest, BadGenerationConfig) {
  WriteModel();
  WriteFile(dir_.file("generation_config.json"), "{\"eos_token_id\": [1, ");
  ExpectError({dir_.file("generation_config.json"), "invalid JSON"});
}

TEST_F(ModelErrorsTest, NoWeights) {
  WriteModel();
  std::filesystem::remove(weights());
  ExpectError({dir_.path(), "model.safetensors"});
}

TEST_F(ModelErrorsTest, MissingShard) {
  WriteModel(300000);
  const std::string shard = "model-00002-of-00003.safetensors";
  ASSERT_TRUE(std::filesystem::exists(dir_.file(shard)));
  std::filesystem::remove(dir_.file(shard));
  ExpectError({dir_.file("model.safetensors.index.json"), shard, "not found", "tensor 'model."});
}

TEST_F(ModelErrorsTest, BadIndexJson) {
  WriteModel(300000);
  WriteFile(dir_.file("model.safetensors.index.json"), "{\"weight_map\": {");
  ExpectError({dir_.file("model.safetensors.index.json"), "invalid JSON"});
}

TEST_F(ModelErrorsTest, IndexWithoutWeightMap) {
  WriteModel(300000);
  WriteFile(dir_.file("model.safetensors.index.json"), "{\"metadata\": {}}");
  ExpectError({dir_.file("model.safetensors.index.json"), "weight_map"});
}

TEST_F(ModelErrorsTest, IndexPointsToTheWrongShard) {
  WriteModel(300000);
  nlohmann::json index = nlohmann::json::parse(ReadFile(dir_.file("model.safetensors.index.json")));
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors";
  WriteFile(dir_.file("model.safetensors.index.json"), index.dump());
  ExpectError({dir_.file("model-00001-of-00003.safetensors"), "missing tensor 'model.norm.weight'",
               dir_.file("model.safetensors.index.json")});
}

TEST_F(ModelErrorsTest, IndexMissesATensor) {
  WriteModel(300000);
  nlohmann::json index = nlohmann::json::parse(ReadFile(dir_.file("model.safetensors.index.json")));
  index["weight_map"].erase("model.layers.1.mlp.up_proj.weight");
  WriteFile(dir_.file("model.safetensors.index.json"), index.dump());
  ExpectError({dir_.file("model.safetensors.index.json"),
               "missing tensor 'model.layers.1.mlp.up_proj.weight'"});
}

TEST_F(ModelErrorsTest, IndexEscapingTheDirectory) {
  WriteModel(300000);
  nlohmann::json index = nlohmann::json::parse(ReadFile(dir_.file("model.safetensors.index.json")));
  index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  WriteFile(dir_.file("model.safetensors.index.json"), index.dump());
  ExpectError({dir_.file("model.safetensors.index.json"), "tensor 'model.norm.weight'",
               "invalid shard file name"});
}

TEST_F(ModelErrorsTest, TruncatedShard) {
  WriteModel(300000);
  const std::string shard = dir_.file("model-00003-of-00003.safetensors");
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 1);
  ExpectError({shard, "tensor 'lm_head.weight'", "truncated"});
}

}  // namespace
}  // namespace tandem
