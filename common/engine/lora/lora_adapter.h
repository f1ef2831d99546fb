#pragma once

// LoRA adapters (Hu et al. 2021) as PEFT publishes them: a directory with adapter_config.json
// and adapter_model.safetensors. An adapter adds to a projection y = W x the low-rank term
// scale * B (A x), A [r, in], B [out, r], scale = lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)).

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/config/model_config.h"

namespace tandem {

// The projections an adapter may target, per decoder layer (PEFT's target_modules names;
// Phi-3's fused qkv_proj and gate_up_proj are split into these at load).
enum class LoraTarget : int { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;
const char* LoraTargetName(LoraTarget t);  // "q_proj", ...

// One targeted projection of one layer: A [rank, in] and B [out, rank], row-major, f32 or bf16
// (LoraLimits::dtype). Absent: both null.
struct LoraMatrices {
  const void* a = nullptr;
  const void* b = nullptr;
  DType dtype = DType::kF32;
  int64_t in = 0;
  int64_t out = 0;

  bool present() const { return a != nullptr; }
};

// A loaded adapter, immutable once made: shared (std::shared_ptr<const LoraAdapter>) by the
// registry and every sequence that uses it, so unloading never frees weights a request still
// reads. A backend keeping a device copy holds a weak reference (weak_from_this) and frees the
// copy once the adapter is gone.
struct LoraAdapter : std::enable_shared_from_this<LoraAdapter> {
  std::string name;        // what requests select it by (the OpenAI `model` field)
  std::string path;        // the directory it was loaded from
  std::string base_model;  // adapter_config.json's base_model_name_or_path (may be empty)
  int64_t rank = 0;
  double alpha = 0;
  bool rslora = false;
  float scale = 0;  // alpha / rank, or alpha / sqrt(rank) with rsLoRA
  // A hash of the weights and the scale: salts the prefix cache's block hashes, so KV computed
  // under one adapter is never reused by a request under another (same bytes: same KV).
  uint64_t cache_key = 0;
  std::vector<std::string> targets;  // the LoraTarget names present, in LoraTarget order
  std::vector<std::array<LoraMatrices, kNumLoraTargets>> layers;  // [num_layers]
  std::vector<uint8_t> storage;                                   // owns every matrix's bytes

  const LoraMatrices& at(int64_t layer, LoraTarget t) const {
    return layers[layer][static_cast<int>(t)];
  }
  size_t bytes() const { return storage.size(); }
};

// Limits of the serving engine (vLLM's flags).
struct LoraLimits {
  int64_t max_lora_rank = 16;  // --max-lora-rank
  // What the matrices are kept in (--lora-dtype): kF32 or kBF16; unset: the file's (bf16 when A
  // and B are bf16, else f32).
  std::optional<DType> dtype;
};

// Loads the PEFT adapter in `dir` for a model of `config`, or refuses it with one message naming
// the adapter and what is wrong: a missing or malformed file, peft_type other than LORA, r over
// max_lora_rank, bias other than "none", DoRA, modules_to_save, rank_pattern / alpha_pattern, a
// target module outside q/k/v/o/gate/up/down (or Phi-3's qkv_proj / gate_up_proj), MLP targets on
// a mixture-of-experts model, a layer index beyond the model's, a tensor name it does not know, an
// A without its B, or shapes that are not this model's (an adapter trained for another base
// model).
absl::StatusOr<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& name,
                                                                   const std::string& dir,
                                                                   const ModelConfig& config,
                                                                   const LoraLimits& limits);

}  // namespace tandem
