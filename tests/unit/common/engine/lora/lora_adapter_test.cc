// Loading PEFT LoRA adapters: what a good one becomes, and one clear refusal per kind of bad one.

#include "common/engine/lora/lora_adapter.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "common/base/half.h"
#include "common/config/model_config.h"
#include "common/engine/lora/lora_writer.h"
#include "common/engine/model/model_writer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;

ModelConfig TinyConfig(int64_t hidden = 64, int64_t experts = 0) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", hidden},
                      {"intermediate_size", 96},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"vocab_size", 128},
                      {"max_position_embeddings", 256}};
  if (experts > 0) {
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j["num_local_experts"] = experts;
    j["num_experts_per_tok"] = 2;
  }
  auto c = ParseModelConfig(j.dump(), "test");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

class LoraAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(::testing::TempDir()) / (std::string("lora_") + info->name())).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const RandomLoraOptions& o, const ModelConfig& c = TinyConfig()) {
    ASSERT_TRUE(WriteRandomLoraAdapter(c, o, dir_).ok());
  }
  void EditConfig(const std::function<void(nlohmann::json&)>& edit) {
    const std::string path = dir_ + "/adapter_config.json";
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(path) << j.dump();
  }
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> Load(int64_t max_rank = 16,
                                                          const ModelConfig& c = TinyConfig()) {
    LoraLimits limits;
    limits.max_lora_rank = max_rank;
    return LoadLoraAdapter("sql", dir_, c, limits);
  }
  // Expects a refusal of `code` whose message names the adapter and contains `part`.
  void ExpectRefused(const absl::StatusOr<std::shared_ptr<const LoraAdapter>>& got,
                     const std::string& part,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_NE(got.status().message().find("LoRA adapter 'sql'"), std::string::npos) << got.status();
    EXPECT_NE(got.status().message().find(part), std::string::npos) << got.status();
  }

  std::string dir_;
};

TEST_F(LoraAdapterTest, LoadsEveryTargetWithItsShapesAndScale) {
  RandomLoraOptions o;
  o.rank = 8;
  o.alpha = 16;
  Write(o);
  auto a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  const LoraAdapter& ad = **a;
  EXPECT_EQ(ad.rank, 8);
  EXPECT_FLOAT_EQ(ad.scale, 2.0f);
  EXPECT_EQ(ad.targets.size(), 7u);
  ASSERT_EQ(ad.layers.size(), 2u);
  const LoraMatrices& q = ad.at(1, LoraTarget::kQ);
  ASSERT_TRUE(q.present());
  EXPECT_EQ(q.in, 64);
  EXPECT_EQ(q.out, 64);
  EXPECT_EQ(ad.at(1, LoraTarget::kK).out, 32);
  EXPECT_EQ(ad.at(0, LoraTarget::kDown).in, 96);
  EXPECT_EQ(ad.at(0, LoraTarget::kDown).out, 64);
  EXPECT_EQ(q.dtype, DType::kF32);
  EXPECT_NE(ad.cache_key, 0u);
}

TEST_F(LoraAdapterTest, RsLoraScalesBySquareRootOfRank) {
  RandomLoraOptions o;
  o.rank = 16;
  o.alpha = 8;
  o.rslora = true;
  Write(o);
  auto a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FLOAT_EQ((*a)->scale, 2.0f);
}

TEST_F(LoraAdapterTest, KeepsBf16AndOnlyTheTargetedModules) {
  RandomLoraOptions o;
  o.dtype = DType::kBF16;
  o.targets = {"q_proj", "v_proj"};
  Write(o);
  auto a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->at(0, LoraTarget::kQ).dtype, DType::kBF16);
  EXPECT_TRUE((*a)->at(0, LoraTarget::kV).present());
  EXPECT_FALSE((*a)->at(0, LoraTarget::kK).present());
  EXPECT_FALSE((*a)->at(0, LoraTarget::kDown).present());
  EXPECT_EQ((*a)->targets, (std::vector<std::string>{"q_proj", "v_proj"}));
}

TEST_F(LoraAdapterTest, LoraDtypeConvertsTheMatrices) {
  Write(RandomLoraOptions());  // f32 file
  LoraLimits limits;
  limits.dtype = DType::kBF16;
  auto bf16 = LoadLoraAdapter("sql", dir_, TinyConfig(), limits);
  auto f32 = Load();
  ASSERT_TRUE(bf16.ok() && f32.ok());
  const LoraMatrices& h = (*bf16)->at(0, LoraTarget::kUp);
  const LoraMatrices& f = (*f32)->at(0, LoraTarget::kUp);
  ASSERT_EQ(h.dtype, DType::kBF16);
  for (int64_t i = 0; i < h.out * 16; ++i) {
    const float want = static_cast<const float*>(f.b)[i];
    EXPECT_EQ(static_cast<const uint16_t*>(h.b)[i], FloatToBf16(want));
  }
  EXPECT_NE((*bf16)->cache_key, (*f32)->cache_key);  // other bytes, other KV
  EXPECT_LT((*bf16)->bytes(), (*f32)->bytes());
}

TEST_F(LoraAdapterTest, CacheKeyFollowsTheWeights) {
  RandomLoraOptions o;
  Write(o);
  auto first = Load();
  auto again = Load();
  o.seed = 2;
  fs::remove_all(dir_);
  Write(o);
  auto other = Load();
  ASSERT_TRUE(first.ok() && again.ok() && other.ok());
  EXPECT_EQ((*first)->cache_key, (*again)->cache_key);
  EXPECT_NE((*first)->cache_key, (*other)->cache_key);
}

TEST_F(LoraAdapterTest, SplitsPhi3FusedProjections) {
  // qkv_proj: one A, B rows q then k then v; gate_up_proj: gate rows then up rows.
  const ModelConfig c = TinyConfig();
  const int64_t r = 4, d = 64, kvd = 32, f = 96;
  std::vector<float> a(r * d), b((d + 2 * kvd) * r), ga(r * d), gb(2 * f * r);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i);
  for (size_t i = 0; i < gb.size(); ++i) gb[i] = static_cast<float>(i);
  std::vector<NamedTensor> tensors;
  auto add = [&](const std::string& name, std::vector<float>& v, int64_t rows, int64_t cols) {
    NamedTensor t;
    t.name = name;
    t.tensor.shape = {rows, cols};
    t.tensor.data = v.data();
    tensors.push_back(t);
  };
  const std::string p = "base_model.model.model.layers.0.";
  add(p + "self_attn.qkv_proj.lora_A.weight", a, r, d);
  add(p + "self_attn.qkv_proj.lora_B.weight", b, d + 2 * kvd, r);
  add(p + "mlp.gate_up_proj.lora_A.weight", ga, r, d);
  add(p + "mlp.gate_up_proj.lora_B.weight", gb, 2 * f, r);
  fs::create_directories(dir_);
  ASSERT_TRUE(WriteSafetensors(dir_ + "/adapter_model.safetensors", tensors).ok());
  std::ofstream(dir_ + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 4, "target_modules": ["qkv_proj", "gate_up_proj"]})";
  auto got = Load(16, c);
  ASSERT_TRUE(got.ok()) << got.status();
  const LoraAdapter& ad = **got;
  EXPECT_EQ(static_cast<const float*>(ad.at(0, LoraTarget::kK).b)[0], d * r);
  EXPECT_EQ(static_cast<const float*>(ad.at(0, LoraTarget::kV).b)[0], (d + kvd) * r);
  EXPECT_EQ(ad.at(0, LoraTarget::kV).out, kvd);
  EXPECT_EQ(static_cast<const float*>(ad.at(0, LoraTarget::kUp).b)[0], f * r);
  EXPECT_FALSE(ad.at(1, LoraTarget::kQ).present());
}

TEST_F(LoraAdapterTest, RefusesRankOverTheLimit) {
  RandomLoraOptions o;
  o.rank = 32;
  Write(o);
  ExpectRefused(Load(16), "rank 32 is over --max-lora-rank 16");
}

TEST_F(LoraAdapterTest, RefusesAnAdapterOfAnotherBaseModel) {
  RandomLoraOptions o;
  o.base_model = "meta-llama/Llama-3.2-1B";
  Write(o, TinyConfig(128));
  ExpectRefused(Load(), "trained for 'meta-llama/Llama-3.2-1B'");
  ExpectRefused(Load(), "needs [16, 96] and [64, 16]");
}

TEST_F(LoraAdapterTest, RefusesUnknownTargetModules) {
  Write(RandomLoraOptions());
  EditConfig([](nlohmann::json& j) { j["target_modules"] = {"q_proj", "lm_head"}; });
  ExpectRefused(Load(), "target module \"lm_head\"");
}

TEST_F(LoraAdapterTest, RefusesTensorsOfUnknownModules) {
  RandomLoraOptions o;
  o.targets = {"q_proj"};
  Write(o);
  // Renames q_proj to a module the engine does not know, in the file's header.
  const std::string path = dir_ + "/adapter_model.safetensors";
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t at; (at = bytes.find("q_proj")) != std::string::npos;) bytes.replace(at, 6, "x_proj");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EditConfig([](nlohmann::json& j) { j.erase("target_modules"); });
  ExpectRefused(Load(), "module 'self_attn.x_proj'");
}

TEST_F(LoraAdapterTest, RefusesWhatItCannotServe) {
  Write(RandomLoraOptions());
  EditConfig([](nlohmann::json& j) { j["bias"] = "lora_only"; });
  ExpectRefused(Load(), "bias \"lora_only\" is not supported");
  EditConfig([](nlohmann::json& j) {
    j["bias"] = "none";
    j["use_dora"] = true;
  });
  ExpectRefused(Load(), "DoRA");
  EditConfig([](nlohmann::json& j) {
    j["use_dora"] = false;
    j["modules_to_save"] = {"lm_head"};
  });
  ExpectRefused(Load(), "modules_to_save");
  EditConfig([](nlohmann::json& j) {
    j["modules_to_save"] = nullptr;
    j["peft_type"] = "IA3";
  });
  ExpectRefused(Load(), "peft_type \"IA3\" is not LORA");
  EditConfig([](nlohmann::json& j) {
    j["peft_type"] = "LORA";
    j.erase("r");
  });
  ExpectRefused(Load(), "needs r");
}

TEST_F(LoraAdapterTest, RefusesMlpAdaptersOnMixtureOfExperts) {
  Write(RandomLoraOptions(), TinyConfig(64, 4));
  ExpectRefused(Load(16, TinyConfig(64, 4)), "mixture-of-experts");
  RandomLoraOptions attention;
  attention.targets = {"q_proj", "o_proj"};
  fs::remove_all(dir_);
  Write(attention, TinyConfig(64, 4));
  EXPECT_TRUE(Load(16, TinyConfig(64, 4)).ok());
}

TEST_F(LoraAdapterTest, RefusesLayersBeyondTheModel) {
  ModelConfig deeper = TinyConfig();
  deeper.num_layers = 3;
  Write(RandomLoraOptions(), deeper);
  ExpectRefused(Load(), "layer 2 but the model has 2 layers");
}

TEST_F(LoraAdapterTest, RefusesMissingFiles) {
  ExpectRefused(Load(), "not a directory", absl::StatusCode::kNotFound);
  Write(RandomLoraOptions());
  fs::remove(dir_ + "/adapter_model.safetensors");
  ExpectRefused(Load(), "no adapter_model.safetensors", absl::StatusCode::kNotFound);
  fs::remove(dir_ + "/adapter_config.json");
  ExpectRefused(Load(), "no adapter_config.json", absl::StatusCode::kNotFound);
}

TEST_F(LoraAdapterTest, RefusesAnAWithoutItsB) {
  RandomLoraOptions o;
  o.targets = {"q_proj"};
  Write(o);
  const std::string path = dir_ + "/adapter_model.safetensors";
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Layer 1's q_proj lora_B renamed to a k_proj lora_B (same length: the header stays valid):
  // q_proj's A then has no B, and k_proj's B no A.
  const std::string from = "layers.1.self_attn.q_proj.lora_B";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, from.size(), "layers.1.self_attn.k_proj.lora_B");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  ExpectRefused(Load(), "without its");
}

}  // namespace
}  // namespace tandem
