#include "common/config/model_config.h"

#include <cmath>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/config/json_fields.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;

// Upper bounds that keep every size product the loader computes far from int64 overflow.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 31;

struct ArchitectureInfo {
  Architecture architecture;
  const char* class_name;
  const char* model_type;
  int64_t default_max_positions;  // Hugging Face's config class default
  int32_t default_bos;            // -1: none
  int32_t default_eos;            // -1: none
};

constexpr ArchitectureInfo kArchitectures[] = {
    {Architecture::kLlama, "LlamaForCausalLM", "llama", 2048, 1, 2},
    {Architecture::kMistral, "MistralForCausalLM", "mistral", 4096 * 32, 1, 2},
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2", 32768, -1, -1},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3", 32768, -1, -1},
    {Architecture::kPhi3, "Phi3ForCausalLM", "phi3", 4096, 1, 32000},
    {Architecture::kGemma3, "Gemma3ForCausalLM", "gemma3_text", 131072, 2, 1},
    {Architecture::kGemma2, "Gemma2ForCausalLM", "gemma2", 8192, 2, 1},
    {Architecture::kMixtral, "MixtralForCausalLM", "mixtral", 4096 * 32, 1, 2},
    {Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe", 32768, -1, -1},
    {Architecture::kQwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe", 32768, -1, -1},
};

const ArchitectureInfo& Info(Architecture a) {
  for (const ArchitectureInfo& info : kArchitectures) {
    if (info.architecture == a) return info;
  }
  return kArchitectures[0];
}

std::string SupportedArchitectures() {
  std::vector<std::string> names;
  for (const ArchitectureInfo& info : kArchitectures) names.push_back(info.class_name);
  return absl::StrJoin(names, ", ");
}

absl::Status Invalid(const std::string& source, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

absl::StatusOr<const ArchitectureInfo*> ResolveArchitecture(const json& doc,
                                                            const std::string& source) {
  std::string name;
  auto it = doc.find("architectures");
  if (it != doc.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string()) {
      return Invalid(source, "field 'architectures' must be a non-empty list of strings");
    }
    name = (*it)[0].get<std::string>();
    for (const ArchitectureInfo& info : kArchitectures) {
      if (name == info.class_name) return &info;
    }
  } else {
    TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                            JsonOptionalString(doc, "model_type", source));
    if (!model_type.has_value()) {
      return Invalid(source, "neither 'architectures' nor 'model_type' is set");
    }
    for (const ArchitectureInfo& info : kArchitectures) {
      if (*model_type == info.model_type) return &info;
    }
    name = absl::StrCat("model_type ", *model_type);
  }
  return absl::UnimplementedError(absl::StrCat(source, ": unsupported architecture '", name,
                                               "' (supported: ", SupportedArchitectures(), ")"));
}

// eos_token_id: an int, a list of ints, or null.
absl::StatusOr<std::optional<std::vector<int32_t>>> ParseTokenIds(const json& doc,
                                                                  const std::string& key,
                                                                  const std::string& source) {
  auto it = doc.find(key);
  if (it == doc.end()) return std::optional<std::vector<int32_t>>();
  std::vector<int32_t> ids;
  if (it->is_null()) return std::optional<std::vector<int32_t>>(ids);
  json list = it->is_array() ? *it : json::array({*it});
  for (const json& v : list) {
    std::optional<int64_t> id = JsonToInt(v);
    if (!id.has_value() || *id < 0 || *id > INT32_MAX) {
      return Invalid(
          source, absl::StrCat("field '", key, "' must be a token id or a list of token ids, got ",
                               it->dump().substr(0, 64)));
    }
    ids.push_back(static_cast<int32_t>(*id));
  }
  return std::optional<std::vector<int32_t>>(ids);
}

absl::StatusOr<std::optional<int32_t>> ParseBos(const json& doc, const std::string& source) {
  auto it = doc.find("bos_token_id");
  if (it == doc.end()) return std::optional<int32_t>();
  if (it->is_null()) return std::optional<int32_t>(-1);
  std::optional<int64_t> id = JsonToInt(*it);
  if (!id.has_value() || *id < 0 || *id > INT32_MAX) {
    return Invalid(source, absl::StrCat("field 'bos_token_id' must be a token id, got ",
                                        it->dump().substr(0, 64)));
  }
  return std::optional<int32_t>(static_cast<int32_t>(*id));
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const json& doc, const std::string& source) {
  RopeScaling scaling;
  auto it = doc.find("rope_scaling");
  if (it == doc.end() || it->is_null()) return scaling;
  if (!it->is_object()) return Invalid(source, "field 'rope_scaling' must be an object or null");
  const json& rs = *it;
  const std::string where = absl::StrCat(source, " (rope_scaling)");
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> type,
                          JsonOptionalString(rs, "rope_type", where));
  if (!type.has_value()) {
    TANDEM_ASSIGN_OR_RETURN(type, JsonOptionalString(rs, "type", where));
  }
  if (!type.has_value()) return Invalid(source, "rope_scaling has neither 'rope_type' nor 'type'");
  if (*type == "default") return scaling;
  auto required_double = [&](const char* key) -> absl::StatusOr<double> {
    TANDEM_ASSIGN_OR_RETURN(std::optional<double> v, JsonOptionalDouble(rs, key, where));
    if (!v.has_value()) {
      return Invalid(source, absl::StrCat("rope_scaling of type '", *type, "' needs '", key, "'"));
    }
    return *v;
  };
  if (*type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    TANDEM_ASSIGN_OR_RETURN(scaling.factor, required_double("factor"));
    return scaling;
  }
  if (*type == "llama3") {
    scaling.type = RopeScaling::Type::kLlama3;
    TANDEM_ASSIGN_OR_RETURN(scaling.factor, required_double("factor"));
    TANDEM_ASSIGN_OR_RETURN(scaling.low_freq_factor, required_double("low_freq_factor"));
    TANDEM_ASSIGN_OR_RETURN(scaling.high_freq_factor, required_double("high_freq_factor"));
    TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> original,
                            JsonOptionalInt(rs, "original_max_position_embeddings", where));
    if (!original.has_value()) {
      return Invalid(source,
                     "rope_scaling of type 'llama3' needs 'original_max_position_embeddings'");
    }
    scaling.original_max_position_embeddings = *original;
    return scaling;
  }
  if (*type == "longrope" || *type == "su") {
    scaling.type = RopeScaling::Type::kLongRope;
    for (const char* key : {"short_factor", "long_factor"}) {
      auto f = rs.find(key);
      if (f == rs.end() || !f->is_array()) {
        return Invalid(source, absl::StrCat("rope_scaling of type '", *type, "' needs '", key,
                                            "' (a list of numbers)"));
      }
      std::vector<double>& out =
          std::string(key) == "short_factor" ? scaling.short_factor : scaling.long_factor;
      for (const json& v : *f) {
        if (!v.is_number()) {
          return Invalid(source, absl::StrCat("rope_scaling '", key, "' must hold numbers"));
        }
        out.push_back(v.get<double>());
      }
    }
    TANDEM_ASSIGN_OR_RETURN(std::optional<double> attention,
                            JsonOptionalDouble(rs, "attention_factor", where));
    scaling.attention_factor = attention.value_or(0.0);  // 0: the default, set by the caller
    return scaling;
  }
  return absl::UnimplementedError(
      absl::StrCat(source, ": unsupported rope_scaling type '", *type,
                   "' (supported: default, linear, llama3, longrope/su)"));
}

// LongRoPE's context: config.json's original_max_position_embeddings (required), and the default
// attention factor transformers' _compute_longrope_parameters derives from it.
absl::Status FinishLongRope(const json& doc, const std::string& source, ModelConfig* c) {
  RopeScaling& rs = c->rope_scaling;
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> original,
                          JsonOptionalInt(doc, "original_max_position_embeddings", source));
  if (!original.has_value()) {
    return Invalid(source,
                   "rope_scaling of type longrope needs 'original_max_position_embeddings'");
  }
  rs.original_max_position_embeddings = *original;
  if (rs.attention_factor == 0.0) {
    const double factor =
        static_cast<double>(c->max_position_embeddings) / static_cast<double>(*original);
    rs.attention_factor =
        factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(*original)));
  }
  return absl::OkStatus();
}

// Qwen3's sliding-window layers (use_sliding_window with max_window_layers, or layer_types naming
// sliding_attention) are not implemented: refuse them, naming the field, rather than serve wrong
// attention. Published Qwen3 checkpoints use full attention in every layer.
absl::Status RequireFullAttention(const json& doc, const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> use_window,
                          JsonOptionalBool(doc, "use_sliding_window", source));
  if (use_window.value_or(false)) {
    return absl::UnimplementedError(
        absl::StrCat(source,
                     ": use_sliding_window true is not supported for this architecture (only full "
                     "attention layers)"));
  }
  auto it = doc.find("layer_types");
  if (it == doc.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Invalid(source, "field 'layer_types' must be a list of strings");
  for (const json& t : *it) {
    if (!t.is_string() || t.get<std::string>() != "full_attention") {
      return absl::UnimplementedError(absl::StrCat(source, ": layer_types entry ",
                                                   t.dump().substr(0, 40),
                                                   " is not supported (only \"full_attention\")"));
    }
  }
  return absl::OkStatus();
}

// Gemma's own fields: its activation, the layer pattern of local (sliding) and global
// attention, the local RoPE base (Gemma 3), the query scale and soft-capping (of attention
// scores: Gemma 2 only).
absl::Status ParseGemma(const json& doc, const std::string& source, ModelConfig* c) {
  const bool gemma2 = c->architecture == Architecture::kGemma2;
  c->qk_norm = !gemma2;
  c->activation = Activation::kGeluTanh;
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> act,
                          JsonOptionalString(doc, "hidden_activation", source));
  if (!act.has_value()) {
    TANDEM_ASSIGN_OR_RETURN(act, JsonOptionalString(doc, "hidden_act", source));
  }
  if (act.has_value() && *act != "gelu_pytorch_tanh") {
    return absl::UnimplementedError(absl::StrCat(source, ": hidden_activation '", *act,
                                                 "' is not supported (only gelu_pytorch_tanh)"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> attn_cap,
                          JsonOptionalDouble(doc, "attn_logit_softcapping", source));
  if (attn_cap.has_value() && !gemma2) {  // Gemma 3 dropped it for q/k norms
    return absl::UnimplementedError(absl::StrCat(
        source, ": attn_logit_softcapping is not supported for Gemma 3 (must be null)"));
  }
  // Gemma2Config's defaults when the field is absent; null means none.
  const bool attn_null = doc.contains("attn_logit_softcapping") && !attn_cap.has_value();
  c->attn_logit_softcapping = attn_cap.value_or(gemma2 && !attn_null ? 50.0 : 0.0);
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> final_cap,
                          JsonOptionalDouble(doc, "final_logit_softcapping", source));
  const bool final_null = doc.contains("final_logit_softcapping") && !final_cap.has_value();
  c->final_logit_softcapping = final_cap.value_or(gemma2 && !final_null ? 30.0 : 0.0);
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> scalar,
                          JsonOptionalDouble(doc, "query_pre_attn_scalar", source));
  c->query_pre_attn_scalar = scalar.value_or(256.0);  // Gemma2/3 configs' default
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> local,
                          JsonOptionalDouble(doc, "rope_local_base_freq", source));
  if (gemma2 && local.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat(source,
                     ": rope_local_base_freq is not a Gemma 2 field (every layer rotates "
                     "with rope_theta)"));
  }
  c->rope_local_theta = gemma2 ? 0.0 : local.value_or(10000.0);
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                          JsonOptionalInt(doc, "sliding_window", source));
  c->sliding_window = window.value_or(4096);
  c->sliding_layers.assign(static_cast<size_t>(std::max<int64_t>(c->num_layers, 0)), 0);
  auto types = doc.find("layer_types");
  if (types != doc.end() && !types->is_null()) {
    if (!types->is_array() || types->size() != c->sliding_layers.size()) {
      return Invalid(source, "field 'layer_types' must list one type per layer");
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
      if (name != "sliding_attention" && name != "full_attention") {
        return absl::UnimplementedError(
            absl::StrCat(source, ": layer_types entry '", name, "' is not supported"));
      }
      c->sliding_layers[i] = name == "sliding_attention";
    }
  } else {  // transformers: layer i is global when (i + 1) % sliding_window_pattern == 0
    TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> pattern,
                            JsonOptionalInt(doc, "sliding_window_pattern", source));
    const int64_t every = pattern.value_or(gemma2 ? 2 : 6);
    if (every <= 0) return Invalid(source, "field 'sliding_window_pattern' must be positive");
    for (size_t i = 0; i < c->sliding_layers.size(); ++i) {
      c->sliding_layers[i] = (static_cast<int64_t>(i) + 1) % every != 0;
    }
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> tie,
                          JsonOptionalBool(doc, "tie_word_embeddings", source));
  c->tie_word_embeddings = tie.value_or(true);  // Gemma2Config's and Gemma3TextConfig's default
  return absl::OkStatus();
}

// The experts of Mixtral (num_local_experts), Qwen3-MoE and Qwen2-MoE (num_experts,
// moe_intermediate_size, norm_topk_prob) and Qwen2-MoE's shared expert
// (shared_expert_intermediate_size); dense layers (decoder_sparse_step, mlp_only_layers) and
// Qwen3-MoE shared experts (transformers' Qwen3-MoE has none) are refused, naming the field.
absl::Status ParseExperts(const json& doc, const std::string& source, ModelConfig* c) {
  const bool mixtral = c->architecture == Architecture::kMixtral;
  const bool qwen2 = c->architecture == Architecture::kQwen2Moe;
  const char* count_key = mixtral ? "num_local_experts" : "num_experts";
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> experts, JsonOptionalInt(doc, count_key, source));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> top,
                          JsonOptionalInt(doc, "num_experts_per_tok", source));
  // Defaults: MixtralConfig's, Qwen2MoeConfig's, Qwen3MoeConfig's.
  c->num_experts = experts.value_or(mixtral ? 8 : qwen2 ? 60 : 128);
  c->num_experts_per_tok = top.value_or(mixtral ? 2 : qwen2 ? 4 : 8);
  if (c->num_experts <= 0 || c->num_experts > 4096) {
    return Invalid(source, absl::StrCat("field '", count_key, "' must be in [1, 4096]"));
  }
  if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > c->num_experts) {
    return Invalid(source, absl::StrCat("field 'num_experts_per_tok' must be in [1, ",
                                        c->num_experts, "], got ", c->num_experts_per_tok));
  }
  if (mixtral) {
    c->norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises
    return absl::OkStatus();
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> ffn,
                          JsonOptionalInt(doc, "moe_intermediate_size", source));
  c->moe_intermediate_size = ffn.value_or(qwen2 ? 1408 : 768);
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> norm,
                          JsonOptionalBool(doc, "norm_topk_prob", source));
  c->norm_topk_prob = norm.value_or(false);  // Qwen3MoeConfig's and Qwen2MoeConfig's default
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> step,
                          JsonOptionalInt(doc, "decoder_sparse_step", source));
  if (step.value_or(1) != 1) {
    return absl::UnimplementedError(absl::StrCat(source, ": decoder_sparse_step ", *step,
                                                 " is not supported (every layer sparse: 1)"));
  }
  auto dense = doc.find("mlp_only_layers");
  if (dense != doc.end() && !dense->is_null() && !(dense->is_array() && dense->empty())) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": mlp_only_layers is not supported (must be empty)"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> shared,
                          JsonOptionalInt(doc, "shared_expert_intermediate_size", source));
  if (qwen2) {
    c->shared_expert_intermediate_size = shared.value_or(5632);  // Qwen2MoeConfig's default
    if (c->shared_expert_intermediate_size <= 0 || c->shared_expert_intermediate_size > kMaxDim) {
      return Invalid(source, absl::StrCat("field 'shared_expert_intermediate_size' must be in [1, ",
                                          kMaxDim, "], got ", c->shared_expert_intermediate_size));
    }
  } else if (shared.value_or(0) > 0) {
    return absl::UnimplementedError(absl::StrCat(
        source,
        ": shared experts (shared_expert_intermediate_size) are not supported for Qwen3-MoE"));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(const std::string& source, const char* field, int64_t value, int64_t max) {
  if (value <= 0 || value > max) {
    return Invalid(source,
                   absl::StrCat("field '", field, "' must be in [1, ", max, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

const char* ArchitectureClassName(Architecture architecture) {
  return Info(architecture).class_name;
}

const char* ArchitectureModelType(Architecture architecture) {
  return Info(architecture).model_type;
}

absl::Status ValidateModelConfig(const ModelConfig& c, const std::string& source) {
  TANDEM_RETURN_IF_ERROR(CheckRange(source, "hidden_size", c.hidden_size, kMaxDim));
  TANDEM_RETURN_IF_ERROR(CheckRange(source, "intermediate_size", c.intermediate_size, kMaxDim));
  TANDEM_RETURN_IF_ERROR(CheckRange(source, "num_hidden_layers", c.num_layers, kMaxLayers));
  TANDEM_RETURN_IF_ERROR(CheckRange(source, "num_attention_heads", c.num_heads, kMaxDim));
  TANDEM_RETURN_IF_ERROR(CheckRange(source, "num_key_value_heads", c.num_kv_heads, kMaxDim));
  TANDEM_RETURN_IF_ERROR(CheckRange(source, "head_dim", c.head_dim, kMaxDim));
  TANDEM_RETURN_IF_ERROR(CheckRange(source, "vocab_size", c.vocab_size, kMaxDim));
  TANDEM_RETURN_IF_ERROR(
      CheckRange(source, "max_position_embeddings", c.max_position_embeddings, kMaxPositions));
  if (c.num_heads % c.num_kv_heads != 0) {
    return Invalid(
        source, absl::StrCat("num_attention_heads (", c.num_heads,
                             ") must be a multiple of num_key_value_heads (", c.num_kv_heads, ")"));
  }
  if (c.rotary_dim < 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0) {
    return Invalid(source, absl::StrCat("rotary dims (head_dim * partial_rotary_factor) must be "
                                        "even and at most head_dim, got ",
                                        c.rotary_dim));
  }
  if (c.head_dim % 2 != 0) {
    return Invalid(source,
                   absl::StrCat("head_dim must be even for rotary embeddings, got ", c.head_dim));
  }
  if (c.num_heads * c.head_dim > kMaxDim) {
    return Invalid(source, "num_attention_heads * head_dim is too large");
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    return Invalid(source, absl::StrCat("field 'rope_theta' must be positive, got ", c.rope_theta));
  }
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    return Invalid(source,
                   absl::StrCat("field 'rms_norm_eps' must be positive, got ", c.rms_norm_eps));
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != RopeScaling::Type::kNone && (!(rs.factor > 0) || !std::isfinite(rs.factor))) {
    return Invalid(source, absl::StrCat("rope_scaling factor must be positive, got ", rs.factor));
  }
  if (rs.type == RopeScaling::Type::kLlama3) {
    if (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor) ||
        !std::isfinite(rs.high_freq_factor)) {
      return Invalid(source,
                     absl::StrCat("rope_scaling needs 0 < low_freq_factor (", rs.low_freq_factor,
                                  ") < high_freq_factor (", rs.high_freq_factor, ")"));
    }
    TANDEM_RETURN_IF_ERROR(CheckRange(source, "rope_scaling.original_max_position_embeddings",
                                      rs.original_max_position_embeddings, kMaxPositions));
  }
  if (rs.type == RopeScaling::Type::kLongRope) {
    const size_t half = static_cast<size_t>(c.rope_dim() / 2);
    if (rs.short_factor.size() != half || rs.long_factor.size() != half) {
      return Invalid(
          source, absl::StrCat("rope_scaling short_factor and long_factor must have ",
                               c.rotary_dim > 0 ? "head_dim * partial_rotary_factor" : "head_dim",
                               " / 2 = ", half, " entries, got ", rs.short_factor.size(), " and ",
                               rs.long_factor.size()));
    }
    for (const std::vector<double>* v : {&rs.short_factor, &rs.long_factor}) {
      for (double f : *v) {
        if (!(f > 0) || !std::isfinite(f)) {
          return Invalid(source, absl::StrCat("rope_scaling factors must be positive, got ", f));
        }
      }
    }
    if (!(rs.attention_factor > 0) || !std::isfinite(rs.attention_factor)) {
      return Invalid(source, absl::StrCat("rope_scaling attention_factor must be positive, got ",
                                          rs.attention_factor));
    }
    TANDEM_RETURN_IF_ERROR(CheckRange(source, "original_max_position_embeddings",
                                      rs.original_max_position_embeddings, kMaxPositions));
  }
  if (c.sliding_window < 0) return Invalid(source, "field 'sliding_window' must not be negative");
  if (!c.sliding_layers.empty() && static_cast<int64_t>(c.sliding_layers.size()) != c.num_layers) {
    return Invalid(source, "sliding layer pattern must name every layer");
  }
  for (double v : {c.rope_local_theta, c.query_pre_attn_scalar, c.final_logit_softcapping,
                   c.attn_logit_softcapping}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return Invalid(source, absl::StrCat("rope_local_base_freq, query_pre_attn_scalar, "
                                          "final_logit_softcapping and attn_logit_softcapping "
                                          "must be finite and >= 0, got ",
                                          v));
    }
  }
  if (c.attn_logit_softcapping > 0 && c.architecture != Architecture::kGemma2) {
    return Invalid(source, "attn_logit_softcapping goes with Gemma 2 only");
  }
  if ((c.architecture == Architecture::kQwen2 || c.architecture == Architecture::kQwen2Moe) &&
      !c.attention_bias) {
    return Invalid(source, "Qwen2 always has q/k/v biases (attention_bias must be true)");
  }
  if ((c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe ||
       c.architecture == Architecture::kGemma3) != c.qk_norm) {
    return Invalid(source, "per-head q/k norms (qk_norm) go with Qwen3 (MoE) and Gemma 3 only");
  }
  const bool moe = IsMoe(c.architecture);
  if (moe != (c.num_experts > 0)) {
    return Invalid(source,
                   "experts go with Mixtral, Qwen3-MoE and Qwen2-MoE only, and they need experts");
  }
  if ((c.architecture == Architecture::kQwen2Moe) != (c.shared_expert_intermediate_size > 0) ||
      c.shared_expert_intermediate_size > kMaxDim) {
    return Invalid(source,
                   "a shared expert (shared_expert_intermediate_size in [1, 2^24]) goes with "
                   "Qwen2-MoE, and Qwen2-MoE needs one");
  }
  if (moe && (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts ||
              c.expert_ffn() <= 0 || c.expert_ffn() > kMaxDim)) {
    return Invalid(source, "num_experts_per_tok must be in [1, experts] and the expert ffn > 0");
  }
  if (c.architecture == Architecture::kQwen3 && c.attention_bias) {
    return Invalid(source, "Qwen3 with attention_bias (biases on q/k/v and o) is not supported");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(json doc, ParseJsonDocument(json_text, source));
  if (!doc.is_object()) return Invalid(source, "config must be a JSON object");
  TANDEM_ASSIGN_OR_RETURN(const ArchitectureInfo* arch, ResolveArchitecture(doc, source));

  ModelConfig c;
  c.architecture = arch->architecture;
  c.architecture_name = arch->class_name;
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                          JsonOptionalString(doc, "model_type", source));
  c.model_type = model_type.value_or(arch->model_type);

  TANDEM_ASSIGN_OR_RETURN(c.hidden_size, JsonRequiredInt(doc, "hidden_size", source));
  TANDEM_ASSIGN_OR_RETURN(c.intermediate_size, JsonRequiredInt(doc, "intermediate_size", source));
  TANDEM_ASSIGN_OR_RETURN(c.num_layers, JsonRequiredInt(doc, "num_hidden_layers", source));
  TANDEM_ASSIGN_OR_RETURN(c.num_heads, JsonRequiredInt(doc, "num_attention_heads", source));
  TANDEM_ASSIGN_OR_RETURN(c.vocab_size, JsonRequiredInt(doc, "vocab_size", source));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                          JsonOptionalInt(doc, "num_key_value_heads", source));
  c.num_kv_heads = kv_heads.value_or(c.num_heads);
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim,
                          JsonOptionalInt(doc, "head_dim", source));
  if (head_dim.has_value()) {
    c.head_dim = *head_dim;
  } else {
    if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0) {
      return Invalid(source, absl::StrCat("hidden_size (", c.hidden_size,
                                          ") is not divisible by num_attention_heads (",
                                          c.num_heads, ") and head_dim is not set"));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> max_pos,
                          JsonOptionalInt(doc, "max_position_embeddings", source));
  c.max_position_embeddings = max_pos.value_or(arch->default_max_positions);
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> theta,
                          JsonOptionalDouble(doc, "rope_theta", source));
  c.rope_theta = theta.value_or(10000.0);
  TANDEM_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(doc, source));
  if (c.rope_scaling.type == RopeScaling::Type::kLongRope) {
    TANDEM_RETURN_IF_ERROR(FinishLongRope(doc, source, &c));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> partial,
                          JsonOptionalDouble(doc, "partial_rotary_factor", source));
  if (partial.has_value() && *partial != 1.0) {
    if (c.architecture != Architecture::kPhi3) {
      return absl::UnimplementedError(absl::StrCat(source, ": partial_rotary_factor ", *partial,
                                                   " is supported for Phi3ForCausalLM only"));
    }
    const double dims = *partial * static_cast<double>(c.head_dim);
    if (!(*partial > 0 && *partial < 1) || dims != std::floor(dims)) {
      return Invalid(
          source, absl::StrCat("partial_rotary_factor ", *partial,
                               " must be in (0, 1] and give whole dims of head_dim ", c.head_dim));
    }
    c.rotary_dim = static_cast<int64_t>(dims);  // transformers: int(head_dim * factor)
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<double> eps,
                          JsonOptionalDouble(doc, "rms_norm_eps", source));
  c.rms_norm_eps = eps.value_or(1e-6);
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> tie,
                          JsonOptionalBool(doc, "tie_word_embeddings", source));
  c.tie_word_embeddings = tie.value_or(false);

  if (IsGemma(c.architecture)) {
    TANDEM_RETURN_IF_ERROR(ParseGemma(doc, source, &c));
  } else {
    TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> act,
                            JsonOptionalString(doc, "hidden_act", source));
    if (act.has_value() && *act != "silu") {
      return absl::UnimplementedError(
          absl::StrCat(source, ": hidden_act '", *act, "' is not supported (only silu)"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, JsonOptionalBool(doc, "mlp_bias", source));
  if (mlp_bias.value_or(false)) {
    return absl::UnimplementedError(absl::StrCat(source, ": mlp_bias is not supported"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> attn_bias,
                          JsonOptionalBool(doc, "attention_bias", source));
  if (c.architecture == Architecture::kQwen2) {
    c.attention_bias = true;  // Qwen2Attention always has q/k/v biases, o_proj none
  } else if (c.architecture == Architecture::kQwen2Moe) {
    // Qwen2MoeAttention: q/k/v biases unless qkv_bias is false (newer transformers), o_proj none.
    TANDEM_ASSIGN_OR_RETURN(std::optional<bool> qkv_bias,
                            JsonOptionalBool(doc, "qkv_bias", source));
    if (!qkv_bias.value_or(true)) {
      return absl::UnimplementedError(
          absl::StrCat(source, ": qkv_bias false is not supported for Qwen2-MoE"));
    }
    if (attn_bias.value_or(false)) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": attention_bias is not a Qwen2-MoE field (q/k/v biases: qkv_bias)"));
    }
    c.attention_bias = true;
  } else if ((c.architecture == Architecture::kQwen3 ||
              c.architecture == Architecture::kQwen3Moe) &&
             attn_bias.value_or(false)) {
    return absl::UnimplementedError(absl::StrCat(
        source, ": attention_bias true is not supported for Qwen3 (it also biases o_proj)"));
  } else if (attn_bias.value_or(false)) {
    // Llama's attention_bias also puts a bias on o_proj, which the engine has no slot for.
    return absl::UnimplementedError(absl::StrCat(
        source, ": attention_bias is only supported for Qwen2 (Llama also biases o_proj)"));
  }

  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> window,
                          JsonOptionalInt(doc, "sliding_window", source));
  if (c.architecture == Architecture::kMistral) {
    c.sliding_window = window.value_or(0);
  } else if (c.architecture == Architecture::kQwen2 || c.architecture == Architecture::kQwen2Moe) {
    TANDEM_ASSIGN_OR_RETURN(std::optional<bool> use_window,
                            JsonOptionalBool(doc, "use_sliding_window", source));
    if (use_window.value_or(false)) c.sliding_window = window.value_or(0);
  } else if (c.architecture == Architecture::kPhi3) {
    c.sliding_window = window.value_or(0);
  } else if (c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe) {
    c.qk_norm = true;
    TANDEM_RETURN_IF_ERROR(RequireFullAttention(doc, source));
  } else if (c.architecture == Architecture::kMixtral) {
    c.sliding_window = window.value_or(0);
  }
  if (IsMoe(c.architecture)) {
    TANDEM_RETURN_IF_ERROR(ParseExperts(doc, source, &c));
  }

  TANDEM_ASSIGN_OR_RETURN(std::optional<int32_t> bos, ParseBos(doc, source));
  c.bos_token_id = bos.value_or(arch->default_bos);
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::vector<int32_t>> eos,
                          ParseTokenIds(doc, "eos_token_id", source));
  if (eos.has_value()) {
    c.eos_token_ids = *eos;
  } else if (arch->default_eos >= 0) {
    c.eos_token_ids = {arch->default_eos};
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> dtype,
                          JsonOptionalString(doc, "torch_dtype", source));
  if (!dtype.has_value()) {
    TANDEM_ASSIGN_OR_RETURN(dtype, JsonOptionalString(doc, "dtype", source));  // newer spelling
  }
  c.torch_dtype = dtype.value_or("");

  TANDEM_RETURN_IF_ERROR(ValidateModelConfig(c, source));
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& config_json_path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_json_path));
  return ParseModelConfig(text, config_json_path);
}

absl::Status MergeGenerationConfig(const std::string& model_dir, ModelConfig* config) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  TANDEM_ASSIGN_OR_RETURN(json doc, ParseJsonDocument(text, path));
  if (!doc.is_object()) return Invalid(path, "generation config must be a JSON object");
  TANDEM_ASSIGN_OR_RETURN(std::optional<int32_t> bos, ParseBos(doc, path));
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::vector<int32_t>> eos,
                          ParseTokenIds(doc, "eos_token_id", path));
  if (bos.has_value() && *bos >= 0) config->bos_token_id = *bos;
  if (eos.has_value()) {
    // Generation stops at any of them: keep config.json's ids and add the new ones in order.
    for (int32_t id : *eos) {
      bool seen = false;
      for (int32_t have : config->eos_token_ids) seen = seen || have == id;
      if (!seen) config->eos_token_ids.push_back(id);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
