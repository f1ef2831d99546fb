// Mixture-of-experts configs (Mixtral, Qwen3-MoE, Qwen2-MoE with its shared expert): parsing,
// round trips and the errors that name unsupported fields. The dense families are in
// model_config_test.cc.
#include <string>

#include "common/config/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// Mixtral-8x7B-v0.1's and Qwen3-30B-A3B's config.json as published (fields the engine ignores
// trimmed).
constexpr char kMixtral8x7b[] = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 32000})";

constexpr char kQwen3_30b_a3b[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
  "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
  "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
  "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// Qwen1.5-MoE-A2.7B's config.json as published (fields the engine ignores trimmed).
constexpr char kQwen15MoeA27b[] = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
  "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936,
  "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
  "norm_topk_prob": false, "output_router_logits": false, "router_aux_loss_coef": 0.001})";

TEST(ModelConfigTest, Qwen2MoeSharedExpert) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen15MoeA27b, "q2/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen2Moe);
  EXPECT_EQ(c->num_experts, 60);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->expert_ffn(), 1408);
  EXPECT_EQ(c->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_TRUE(c->attention_bias);  // Qwen2 attention: q/k/v biases
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);  // use_sliding_window false
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c), "y");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);

  // Qwen2MoeConfig's defaults when the MoE fields are absent.
  absl::StatusOr<ModelConfig> d = ParseModelConfig(
      R"({"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})",
      "d/config.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->architecture, Architecture::kQwen2Moe);
  EXPECT_EQ(d->num_experts, 60);
  EXPECT_EQ(d->num_experts_per_tok, 4);
  EXPECT_EQ(d->expert_ffn(), 1408);
  EXPECT_EQ(d->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(d->norm_topk_prob);
}

TEST(ModelConfigTest, MixtureOfExperts) {
  absl::StatusOr<ModelConfig> m = ParseModelConfig(kMixtral8x7b, "m/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->architecture, Architecture::kMixtral);
  EXPECT_EQ(m->num_experts, 8);
  EXPECT_EQ(m->num_experts_per_tok, 2);
  EXPECT_EQ(m->expert_ffn(), 14336);
  EXPECT_TRUE(m->norm_topk_prob);
  EXPECT_FALSE(m->qk_norm);
  absl::StatusOr<ModelConfig> q = ParseModelConfig(kQwen3_30b_a3b, "q/config.json");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(q->num_experts, 128);
  EXPECT_EQ(q->num_experts_per_tok, 8);
  EXPECT_EQ(q->expert_ffn(), 768);
  EXPECT_TRUE(q->norm_topk_prob);
  EXPECT_TRUE(q->qk_norm);
  for (const ModelConfig* c : {&*m, &*q}) {
    absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*c), "y");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, *c);
  }
}

TEST(ModelConfigTest, MixtureOfExpertsUnsupportedFieldsAreNamed) {
  auto with = [](const char* doc, const std::string& from, const std::string& to) {
    std::string s = doc;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::pair<std::string, std::string> cases[] = {
      {with(kQwen3_30b_a3b, R"("decoder_sparse_step": 1)", R"("decoder_sparse_step": 2)"),
       "decoder_sparse_step"},
      {with(kQwen3_30b_a3b, R"("mlp_only_layers": [])", R"("mlp_only_layers": [0, 3])"),
       "mlp_only_layers"},
      {with(kQwen3_30b_a3b, R"("use_cache": true)", R"("shared_expert_intermediate_size": 512)"),
       "shared_expert_intermediate_size"},
      {with(kQwen15MoeA27b, R"("decoder_sparse_step": 1)", R"("decoder_sparse_step": 2)"),
       "decoder_sparse_step"},
      {with(kQwen15MoeA27b, R"("use_cache": true)", R"("mlp_only_layers": [1])"),
       "mlp_only_layers"},
      {with(kQwen15MoeA27b, R"("shared_expert_intermediate_size": 5632)",
            R"("shared_expert_intermediate_size": 0)"),
       "shared_expert_intermediate_size"},
      {with(kQwen15MoeA27b, R"("use_cache": true)", R"("qkv_bias": false)"), "qkv_bias"},
      {with(kQwen15MoeA27b, R"("num_experts_per_tok": 4)", R"("num_experts_per_tok": 61)"),
       "num_experts_per_tok"},
      {with(kMixtral8x7b, R"("num_experts_per_tok": 2)", R"("num_experts_per_tok": 9)"),
       "num_experts_per_tok"},
      {with(kMixtral8x7b, R"("num_local_experts": 8)", R"("num_local_experts": 0)"),
       "num_local_experts"},
  };
  for (const auto& [json, needle] : cases) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(json, "e/config.json");
    ASSERT_FALSE(c.ok()) << needle;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(needle));
  }
}

}  // namespace
}  // namespace tandem
