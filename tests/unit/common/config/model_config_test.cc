#include "common/config/model_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kLlama2_7b[] = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "use_cache": true, "vocab_size": 32000})";

constexpr char kLlama31_8b_instruct[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 128256})";

constexpr char kLlama32_1b[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "vocab_size": 128256})";

constexpr char kMistral7b[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "vocab_size": 32000})";

constexpr char kQwen25_05b[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936})";

// The smallest valid Llama config; tests splice fields into it.
std::string MinimalLlama(const std::string& extra = "") {
  return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100)" +
         extra + "}";
}

TEST(ModelConfigTest, Llama2) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama2_7b, "llama2/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->architecture_name, "LlamaForCausalLM");
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 11008);
  EXPECT_EQ(c->num_layers, 32);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 32);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c->torch_dtype, "float16");
}

TEST(ModelConfigTest, Llama31WithLlama3RopeScalingAndEosList) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31_8b_instruct, "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
}

TEST(ModelConfigTest, Llama32TiedWithExplicitHeadDim) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama32_1b, "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->max_position_embeddings, 131072);
}

TEST(ModelConfigTest, LinearRopeScalingWithLegacyTypeKey) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      MinimalLlama(R"(, "rope_scaling": {"type": "linear", "factor": 4.0})"), "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 4.0);
}

TEST(ModelConfigTest, Mistral) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kMistral7b, "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kMistral);
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FALSE(c->attention_bias);
}

TEST(ModelConfigTest, Qwen2ImpliesAttentionBiasAndIgnoresUnusedWindow) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen25_05b, "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->sliding_window, 0);  // use_sliding_window is false
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151643));
}

// Qwen3-0.6B's config.json as published.
constexpr char kQwen3_06b[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

TEST(ModelConfigTest, Qwen3HasPerHeadQkNormsAndNoBias) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3_06b, "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_heads * c->head_dim, 2048) << "q is wider than hidden";
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->rope_theta, 1000000.0);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c), "y");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
}

TEST(ModelConfigTest, Qwen3UnsupportedFieldsAreNamed) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = kQwen3_06b;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::pair<std::string, std::string> cases[] = {
      {with(R"("attention_bias": false)", R"("attention_bias": true)"), "attention_bias"},
      {with(R"("use_sliding_window": false)", R"("use_sliding_window": true)"),
       "use_sliding_window"},
      {with(R"("use_cache": true)", R"("layer_types": ["full_attention", "sliding_attention"])"),
       "layer_types entry \"sliding_attention\""},
      {with(R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "yarn", "factor": 4})"),
       "rope_scaling type 'yarn'"},
      {with(R"("hidden_act": "silu")", R"("hidden_act": "gelu")"), "hidden_act 'gelu'"},
  };
  for (const auto& [json, needle] : cases) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(json, "q/config.json");
    ASSERT_FALSE(c.ok()) << needle;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(needle));
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("q/config.json"));
  }
  std::string full = with(R"("use_cache": true)", R"("layer_types": ["full_attention"])");
  EXPECT_TRUE(ParseModelConfig(full, "q").ok());
}

// Phi-3-mini-128k-instruct's config.json as published but for the factor lists (48 each there,
// made up here) and fields the engine ignores.
std::string Phi3Mini128k(const std::string& rope_type = "longrope", const std::string& extra = "") {
  std::string shorts, longs;
  for (int i = 0; i < 48; ++i) {
    shorts += (i ? ", " : "") + std::to_string(1.0 + 0.01 * i);
    longs += (i ? ", " : "") + std::to_string(1.0 + 1.5 * i);
  }
  return R"({"architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
    "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
    "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": {"long_factor": [)" +
         longs + R"(], "short_factor": [)" + shorts + R"(], "type": ")" + rope_type + R"("},
    "sliding_window": 262144, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 32064)" +
         extra + "}";
}

TEST(ModelConfigTest, Phi3WithLongRope) {
  for (const std::string type : {"longrope", "su"}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(Phi3Mini128k(type), "x/config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->architecture, Architecture::kPhi3);
    EXPECT_EQ(c->model_type, "phi3");
    EXPECT_EQ(c->head_dim, 96);
    EXPECT_EQ(c->sliding_window, 262144);
    const RopeScaling& rs = c->rope_scaling;
    EXPECT_EQ(rs.type, RopeScaling::Type::kLongRope);
    EXPECT_EQ(rs.original_max_position_embeddings, 4096);
    ASSERT_EQ(rs.short_factor.size(), 48u);
    EXPECT_DOUBLE_EQ(rs.long_factor[2], 4.0);
    // transformers' default: sqrt(1 + ln(131072 / 4096) / ln(4096)).
    EXPECT_NEAR(rs.attention_factor, 1.1902380714238083, 1e-12);
    absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c), "y");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, *c);
  }
  absl::StatusOr<ModelConfig> explicit_factor = ParseModelConfig(
      [] {
        std::string s = Phi3Mini128k();
        s.replace(s.find(R"("type": "longrope")"), 18,
                  R"("type": "longrope", "attention_factor": 1.5)");
        return s;
      }(),
      "x");
  ASSERT_TRUE(explicit_factor.ok()) << explicit_factor.status();
  EXPECT_EQ(explicit_factor->rope_scaling.attention_factor, 1.5);
}

TEST(ModelConfigTest, Phi3UnsupportedFieldsAreNamed) {
  const std::pair<std::string, std::string> cases[] = {
      {Phi3Mini128k("longrope", R"(, "partial_rotary_factor": 0.75)"), "partial_rotary_factor"},
      {Phi3Mini128k("yarn"), "rope_scaling type 'yarn'"},
      {[] {
         std::string s = Phi3Mini128k();
         s.replace(s.find(R"("original_max_position_embeddings": 4096, )"), 42, "");
         return s;
       }(),
       "original_max_position_embeddings"},
      {[] {
         std::string s = Phi3Mini128k();
         s.replace(s.find("[1.000000, "), 11, "[");
         return s;
       }(),
       "head_dim / 2 = 48 entries"},
  };
  for (const auto& [json, needle] : cases) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(json, "p/config.json");
    ASSERT_FALSE(c.ok()) << needle;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(needle));
  }
}

// gemma-3-1b-it's config.json as published (no layer_types: the pattern decides).
constexpr char kGemma3_1b[] = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
  "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
  "use_cache": true, "vocab_size": 262144})";

TEST(ModelConfigTest, Gemma3LayerPatternAndItsFields) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGemma3_1b, "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGemma3);
  EXPECT_EQ(c->model_type, "gemma3_text");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings) << "Gemma3TextConfig's default";
  EXPECT_EQ(c->activation, Activation::kGeluTanh);
  EXPECT_EQ(c->sliding_window, 512);
  ASSERT_EQ(c->sliding_layers.size(), 26u);
  for (int i = 0; i < 26; ++i) EXPECT_EQ(c->sliding_layers[i], (i + 1) % 6 != 0) << i;
  EXPECT_EQ(c->rope_local_theta, 10000.0);
  EXPECT_EQ(c->query_pre_attn_scalar, 256.0);
  EXPECT_EQ(c->final_logit_softcapping, 0.0);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(1, 106));
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c), "y");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
}

TEST(ModelConfigTest, Gemma3UnsupportedFieldsAreNamed) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = kGemma3_1b;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::pair<std::string, std::string> cases[] = {
      {with(R"("attn_logit_softcapping": null)", R"("attn_logit_softcapping": 50.0)"),
       "attn_logit_softcapping"},
      {with(R"("gelu_pytorch_tanh")", R"("gelu")"), "hidden_activation 'gelu'"},
      {with(R"("use_cache": true)", R"("layer_types": ["chunked_attention"])"),
       "field 'layer_types' must list one type per layer"},
      {with(R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "dynamic", "factor": 2})"),
       "rope_scaling type 'dynamic'"},
  };
  for (const auto& [json, needle] : cases) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(json, "g/config.json");
    ASSERT_FALSE(c.ok()) << needle;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(needle));
  }
}

// gemma-2-2b-it's config.json as published (no layer_types: every other layer slides).
constexpr char kGemma2_2b[] = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
  "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4",
  "use_cache": true, "vocab_size": 256000})";

TEST(ModelConfigTest, Gemma2AlternatingLayersAndSoftCaps) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGemma2_2b, "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGemma2);
  EXPECT_EQ(c->model_type, "gemma2");
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings) << "Gemma2Config's default";
  EXPECT_EQ(c->activation, Activation::kGeluTanh);
  ASSERT_EQ(c->sliding_layers.size(), 26u);
  for (int i = 0; i < 26; ++i) EXPECT_EQ(c->sliding_layers[i], i % 2 == 0) << i;
  EXPECT_EQ(c->rope_local_theta, 0.0) << "one RoPE base for every layer";
  EXPECT_EQ(c->attn_logit_softcapping, 50.0);
  EXPECT_EQ(c->final_logit_softcapping, 30.0);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(1, 107));
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c), "y");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
  std::string relu = kGemma2_2b;
  relu.replace(relu.find(R"("hidden_activation": "gelu_pytorch_tanh")"), 40,
               R"("hidden_activation": "relu")");
  EXPECT_THAT(std::string(ParseModelConfig(relu, "g").status().message()),
              HasSubstr("hidden_activation 'relu'"));
}

// Phi-4-mini-instruct's config.json (factors shortened to their count, fields the engine ignores
// trimmed): Phi3ForCausalLM with partial rotary and tied embeddings.
std::string Phi4Mini() {
  std::string factors;
  for (int i = 0; i < 48; ++i) factors += (i ? ", " : "") + std::to_string(1.0 + 0.01 * i);
  return R"({"architectures": ["Phi3ForCausalLM"], "attention_bias": false,
  "bos_token_id": 199999, "eos_token_id": 199999, "full_attn_mod": 1, "hidden_act": "silu",
  "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 131072,
  "model_type": "phi3", "num_attention_heads": 24, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "original_max_position_embeddings": 4096, "pad_token_id": 199999,
  "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-05, "rope_scaling": {"long_factor": [)" +
         factors + R"(], "short_factor": [)" + factors + R"(], "type": "longrope"},
  "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "vocab_size": 200064})";
}

TEST(ModelConfigTest, Phi4MiniRotatesThreeQuartersOfEachHead) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(Phi4Mini(), "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kPhi3);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rotary_dim, 96);
  EXPECT_EQ(c->rope_dim(), 96);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_scaling.short_factor.size(), 48u);
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c), "y");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
}

TEST(ModelConfigTest, HuggingFaceDefaults) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(MinimalLlama(), "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c->model_type, "llama");

  // Integral floats are accepted for integer fields; null ids mean "none".
  c = ParseModelConfig(MinimalLlama(R"(, "num_key_value_heads": 2.0, "bos_token_id": null,
                                       "eos_token_id": null)"),
                       "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(ModelConfigTest, ArchitectureFromModelTypeWhenArchitecturesIsMissing) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      R"({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10})",
      "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen2);
  EXPECT_EQ(c->architecture_name, "Qwen2ForCausalLM");
}

TEST(ModelConfigTest, BundledStories260k) {
  absl::StatusOr<ModelConfig> c =
      LoadModelConfig(tandem::TestSourceDir() + "/models/stories260k/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->torch_dtype, "float32");
}

struct BadCase {
  const char* name;
  std::string json;
  const char* expected;  // substring of the error besides the file name
};

TEST(ModelConfigTest, ErrorsNameTheFileAndTheProblem) {
  const BadCase cases[] = {
      {"bad_json", R"({"architectures": ["LlamaForCausalLM"], )", "invalid JSON"},
      {"not_object", "[1, 2]", "JSON object"},
      {"unsupported", R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 768})",
       "unsupported architecture 'GPT2LMHeadModel'"},
      {"no_arch", R"({"hidden_size": 64})", "neither 'architectures' nor 'model_type'"},
      {"missing_field",
       R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 1,
           "num_hidden_layers": 2, "vocab_size": 100})",
       "'num_attention_heads' is missing"},
      {"wrong_type", MinimalLlama(R"(, "rope_theta": "big")"), "'rope_theta' must be a number"},
      {"fraction", MinimalLlama(R"(, "num_key_value_heads": 2.5)"),
       "'num_key_value_heads' must be an integer"},
      {"zero_layers",
       R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 0, "num_attention_heads": 4, "vocab_size": 100})",
       "'num_hidden_layers' must be in [1"},
      {"negative_vocab",
       R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": -5})",
       "'vocab_size' must be in [1"},
      {"kv_not_divisor", MinimalLlama(R"(, "num_key_value_heads": 3)"),
       "must be a multiple of num_key_value_heads"},
      {"hidden_not_divisible",
       R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 65, "intermediate_size": 128,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100})",
       "not divisible by num_attention_heads"},
      {"odd_head_dim", MinimalLlama(R"(, "head_dim": 7)"), "head_dim must be even"},
      {"huge", MinimalLlama(R"(, "head_dim": 99999999999999)"), "'head_dim' must be in [1"},
      {"bad_rope_type", MinimalLlama(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4})"),
       "unsupported rope_scaling type 'yarn'"},
      {"llama3_missing", MinimalLlama(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8})"),
       "needs 'low_freq_factor'"},
      {"llama3_order", MinimalLlama(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8,
           "low_freq_factor": 4, "high_freq_factor": 4, "original_max_position_embeddings": 8})"),
       "low_freq_factor"},
      {"gelu", MinimalLlama(R"(, "hidden_act": "gelu")"), "hidden_act 'gelu'"},
      {"mlp_bias", MinimalLlama(R"(, "mlp_bias": true)"), "mlp_bias"},
      {"llama_attention_bias", MinimalLlama(R"(, "attention_bias": true)"), "attention_bias"},
      {"eos_string", MinimalLlama(R"(, "eos_token_id": "</s>")"), "'eos_token_id'"},
      {"zero_theta", MinimalLlama(R"(, "rope_theta": 0)"), "'rope_theta' must be positive"},
  };
  for (const BadCase& bad : cases) {
    const std::string source = std::string("/models/") + bad.name + "/config.json";
    absl::StatusOr<ModelConfig> c = ParseModelConfig(bad.json, source);
    ASSERT_FALSE(c.ok()) << bad.name;
    EXPECT_THAT(c.status().message(), HasSubstr(source)) << bad.name;
    EXPECT_THAT(c.status().message(), HasSubstr(bad.expected)) << bad.name;
  }
}

TEST(ModelConfigTest, LoadNamesAMissingFile) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig("/nonexistent/dir/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/dir/config.json"));
}

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::path(testing::TempDir()) / ("model_config_test_" + name)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  void Write(const std::string& file, const std::string& text) const {
    std::ofstream(path_ / file, std::ios::binary) << text;
  }

 private:
  std::filesystem::path path_;
};

TEST(ModelConfigTest, MergeGenerationConfigAddsEosIdsAndOverridesBos) {
  TempDir dir("merge");
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama32_1b, "x/config.json");
  ASSERT_TRUE(c.ok());
  // Absent file: nothing changes.
  ModelConfig before = *c;
  ASSERT_TRUE(MergeGenerationConfig(dir.path(), &*c).ok());
  EXPECT_EQ(*c, before);

  dir.Write("generation_config.json",
            R"({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
                "do_sample": true, "temperature": 0.6})");
  ASSERT_TRUE(MergeGenerationConfig(dir.path(), &*c).ok());
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));

  dir.Write("generation_config.json", R"({"eos_token_id": 7, )");
  absl::Status s = MergeGenerationConfig(dir.path(), &*c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir.path() + "/generation_config.json"));
}

TEST(ModelConfigTest, ToJsonRoundTrips) {
  for (const char* text :
       {kLlama2_7b, kLlama31_8b_instruct, kLlama32_1b, kMistral7b, kQwen25_05b}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(text, "x/config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    std::string json = ModelConfigToJson(*c);
    absl::StatusOr<ModelConfig> back = ParseModelConfig(json, "y/config.json");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    EXPECT_EQ(*back, *c) << json;
  }
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      MinimalLlama(R"(, "rope_scaling": {"type": "linear", "factor": 2.5}, "rms_norm_eps": 1.3e-7,
                      "eos_token_id": [5, 6], "bos_token_id": null)"),
      "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c), "y/config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
}

}  // namespace
}  // namespace tandem
