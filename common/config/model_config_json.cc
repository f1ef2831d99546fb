// ModelConfigToJson: the inverse of ParseModelConfig, for tools that write model directories.

#include <string>

#include "common/config/model_config.h"
#include "nlohmann/json.hpp"

namespace tandem {

std::string ModelConfigToJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture_name.empty() ? ArchitectureClassName(c.architecture)
                                                    : c.architecture_name};
  j["model_type"] = c.model_type.empty() ? ArchitectureModelType(c.architecture) : c.model_type;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  if (IsGemma(c.architecture)) {
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
    if (c.architecture == Architecture::kGemma3) j["rope_local_base_freq"] = c.rope_local_theta;
    j["sliding_window"] = c.sliding_window;
    nlohmann::ordered_json types = nlohmann::ordered_json::array();
    for (uint8_t s : c.sliding_layers) types.push_back(s ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    j["attn_logit_softcapping"] = c.attn_logit_softcapping > 0
                                      ? nlohmann::ordered_json(c.attn_logit_softcapping)
                                      : nlohmann::ordered_json(nullptr);
    j["final_logit_softcapping"] = c.final_logit_softcapping > 0
                                       ? nlohmann::ordered_json(c.final_logit_softcapping)
                                       : nlohmann::ordered_json(nullptr);
  } else {
    j["hidden_act"] = "silu";
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rotary_dim > 0 && c.rotary_dim != c.head_dim) {
    j["partial_rotary_factor"] =
        static_cast<double>(c.rotary_dim) / static_cast<double>(c.head_dim);
  }
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
    case RopeScaling::Type::kLongRope:
      j["rope_scaling"] = {{"type", "longrope"},
                           {"short_factor", c.rope_scaling.short_factor},
                           {"long_factor", c.rope_scaling.long_factor},
                           {"attention_factor", c.rope_scaling.attention_factor}};
      j["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
      break;
  }
  if (c.architecture == Architecture::kLlama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  if (c.architecture == Architecture::kMistral || c.architecture == Architecture::kPhi3) {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
  }
  if (c.architecture == Architecture::kQwen2 || c.architecture == Architecture::kQwen2Moe) {
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
  }
  if (c.architecture == Architecture::kMixtral) {
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
  }
  if (c.architecture == Architecture::kQwen3Moe || c.architecture == Architecture::kQwen2Moe) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
  }
  if (c.architecture == Architecture::kQwen2Moe) {
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  }
  if (c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe) {
    j["attention_bias"] = c.attention_bias;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id >= 0 ? nlohmann::ordered_json(c.bos_token_id) : nullptr;
  if (c.eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else {
    j["eos_token_id"] = c.eos_token_ids;
  }
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace tandem
