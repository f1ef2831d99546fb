#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// Architectures the engine implements. All are decoder-only Llama-family transformers with
// RMSNorm, rotary position embeddings (rotate_half layout), GQA attention and a SwiGLU MLP.
enum class Architecture {
  kLlama,    // LlamaForCausalLM: Llama 2, 3, 3.1, 3.2
  kMistral,  // MistralForCausalLM (same math; sliding window is not used by these checkpoints)
  kQwen2,    // Qwen2ForCausalLM: bias on q/k/v projections
  kQwen3,    // Qwen3ForCausalLM: per-head RMSNorm of q and k before RoPE, no biases
  kPhi3,     // Phi3ForCausalLM: fused qkv_proj and gate_up_proj (split at load), LongRoPE
  // Gemma3ForCausalLM (text): embeddings scaled by sqrt(hidden), RMSNorm weights as (1 + w),
  // norms before and after attention and MLP, per-head q/k norms, GeGLU (tanh GELU), local
  // sliding-window layers (their own RoPE base) alternating with global ones.
  kGemma3,
  // Gemma2ForCausalLM: Gemma 3 without q/k norms and without a local RoPE base, with attention
  // logit soft-capping; local and global layers alternate one by one.
  kGemma2,
  // Mixture of experts: MixtralForCausalLM (Mistral attention), Qwen3MoeForCausalLM (Qwen3
  // attention) and Qwen2MoeForCausalLM (Qwen2 attention, plus a shared expert); every layer's
  // MLP is a router choosing num_experts_per_tok of num_experts SwiGLU experts per token.
  kMixtral,
  kQwen3Moe,
  kQwen2Moe,
};

// Mixtral, Qwen3-MoE and Qwen2-MoE: every layer's MLP is a mixture of experts.
inline bool IsMoe(Architecture a) {
  return a == Architecture::kMixtral || a == Architecture::kQwen3Moe ||
         a == Architecture::kQwen2Moe;
}

// Gemma 2 and 3: scaled embeddings, (1 + w) norm weights, norms after attention and MLP.
inline bool IsGemma(Architecture a) {
  return a == Architecture::kGemma2 || a == Architecture::kGemma3;
}

enum class Activation { kSilu, kGeluTanh };

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kLongRope };
  Type type = Type::kNone;
  double factor = 1.0;
  // llama3 only:
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and longrope (Phi-3's config.json carries it beside rope_scaling):
  int64_t original_max_position_embeddings = 8192;
  // longrope ("su" in older Phi-3 configs): per-frequency divisors, head_dim / 2 each; positions
  // below original_max_position_embeddings rotate with short_factor, the others with
  // long_factor; cos and sin are scaled by attention_factor (its default:
  // sqrt(1 + ln(max_position_embeddings / original) / ln(original)) when that ratio exceeds 1).
  std::vector<double> short_factor;
  std::vector<double> long_factor;
  double attention_factor = 1.0;

  bool operator==(const RopeScaling&) const = default;
};

// The parts of a Hugging Face config.json the engine needs, validated.
struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as written in config.json, e.g. "LlamaForCausalLM"
  std::string model_type;         // "llama", "mistral", "qwen2"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // defaults to num_heads when absent
  int64_t head_dim = 0;      // defaults to hidden_size / num_heads when absent
  // Leading dims of each head RoPE rotates (head_dim * partial_rotary_factor, Phi-4-mini); the
  // rest pass through. 0: head_dim.
  int64_t rotary_dim = 0;
  int64_t rope_dim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v (and not o) carry a bias; always true for Qwen2 (MoE)
  int64_t sliding_window = 0;   // 0: none
  // q and k are RMS-normalised per head (weights [head_dim]) before RoPE; always true for Qwen3.
  bool qk_norm = false;
  Activation activation = Activation::kSilu;  // of the gated MLP: silu (SwiGLU) or GeGLU
  // Per layer: 1 where the layer attends within sliding_window, 0 where it attends globally.
  // Empty: every layer uses sliding_window (0: none), as Mistral.
  std::vector<uint8_t> sliding_layers;
  double rope_local_theta = 0;         // RoPE base of sliding layers (Gemma 3); 0: rope_theta
  double query_pre_attn_scalar = 0;    // scores scaled by its -1/2 power; 0: head_dim
  double final_logit_softcapping = 0;  // logits = cap * tanh(logits / cap); 0: none
  double attn_logit_softcapping = 0;   // scores = cap * tanh(scores / cap) (Gemma 2); 0: none
  // Mixture of experts (0 experts: a dense MLP). Routing: softmax over the router's logits, the
  // top num_experts_per_tok, renormalised to sum 1 when norm_topk_prob (always for Mixtral).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;  // each expert's ffn; 0: intermediate_size (Mixtral)
  bool norm_topk_prob = true;
  // Qwen2-MoE's shared expert: a dense SwiGLU MLP of this ffn every token runs, its output
  // scaled by sigmoid(shared_expert_gate(x)) and added to the routed experts' sum. 0: none.
  int64_t shared_expert_intermediate_size = 0;
  int64_t expert_ffn() const {
    return moe_intermediate_size > 0 ? moe_intermediate_size : intermediate_size;
  }
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;  // config.json's eos_token_id (int or list)
  std::string torch_dtype;             // "float32", "bfloat16", "float16" or empty

  bool operator==(const ModelConfig&) const = default;
};

// Parses and validates a config.json document. Errors name `source` (the file path) and the
// offending field.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& config_json_path);

// Reads generation_config.json if present and merges its eos_token_id(s) / bos into `config`.
// Absent file: OK, nothing changes.
absl::Status MergeGenerationConfig(const std::string& model_dir, ModelConfig* config);

// Checks the invariants ParseModelConfig guarantees (positive sizes, heads divisible by KV heads,
// even head_dim, sane rope scaling, ...). Errors name `source` and the field.
absl::Status ValidateModelConfig(const ModelConfig& config, const std::string& source);

// The canonical class name of an architecture ("LlamaForCausalLM", ...) and its model_type.
const char* ArchitectureClassName(Architecture architecture);
const char* ArchitectureModelType(Architecture architecture);

// Writes `config` as a Hugging Face config.json document (pretty-printed, trailing newline) that
// ParseModelConfig reads back to an equal config.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace tandem
