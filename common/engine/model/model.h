#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/base/huge_page_arena.h"
#include "common/config/model_config.h"
#include "common/engine/model/quant_config.h"
#include "common/engine/model/tensor.h"

namespace tandem {

class MappedFile;

// Weights of one transformer layer, in Hugging Face layout: every projection is [out, in]
// row-major (y = x W^T). Projections are f32 or bf16 (LoadOptions::weight_dtype); norms and
// biases are always f32. Gemma 3's norm weights w are held as (1 + w), what its RMSNorm
// multiplies by, so every norm is x / rms(x) * weight.
// One expert of a mixture-of-experts MLP (SwiGLU, like the dense MLP; ffn = expert_ffn()).
struct ExpertWeights {
  Tensor gate_proj;  // [ffn, hidden]  Mixtral: w1; Qwen3-MoE: gate_proj
  Tensor up_proj;    // [ffn, hidden]  Mixtral: w3; Qwen3-MoE: up_proj
  Tensor down_proj;  // [hidden, ffn]  Mixtral: w2; Qwen3-MoE: down_proj
};

struct LayerWeights {
  Tensor input_norm;    // [hidden]               input_layernorm.weight
  Tensor q_proj;        // [heads*head_dim, hidden]
  Tensor k_proj;        // [kv_heads*head_dim, hidden]
  Tensor v_proj;        // [kv_heads*head_dim, hidden]
  Tensor q_bias;        // [heads*head_dim]      Qwen2 / attention_bias only; else empty
  Tensor k_bias;        // [kv_heads*head_dim]
  Tensor v_bias;        // [kv_heads*head_dim]
  Tensor q_norm;        // [head_dim]  self_attn.q_norm.weight, per-head RMSNorm (Qwen3); else empty
  Tensor k_norm;        // [head_dim]  self_attn.k_norm.weight
  Tensor o_proj;        // [hidden, heads*head_dim]
  Tensor post_norm;     // [hidden]               post_attention_layernorm.weight (Gemma 3: of the
                        //                        attention output; others: before the MLP)
  Tensor pre_ffw_norm;  // [hidden]  pre_feedforward_layernorm.weight (Gemma 3); else empty
  Tensor post_ffw_norm;  // [hidden]  post_feedforward_layernorm.weight (Gemma 3); else empty
  Tensor gate_proj;      // [ffn, hidden]
  Tensor up_proj;        // [ffn, hidden]
  Tensor down_proj;      // [hidden, ffn]
  // Mixture of experts (config.num_experts > 0) instead of gate/up/down: the router, always f32
  // (never quantized: routing must not move with the weights' precision), and the experts.
  Tensor router;  // [experts, hidden]  block_sparse_moe.gate.weight / mlp.gate.weight
  std::vector<ExpertWeights> experts;
  // Qwen2-MoE's shared expert (mlp.shared_expert.{gate,up,down}_proj, ffn =
  // shared_expert_intermediate_size) and its gate (mlp.shared_expert_gate.weight [1, hidden],
  // f32 like the router); empty otherwise.
  ExpertWeights shared_expert;
  Tensor shared_expert_gate;
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden] (f32 or bf16, like the projections)
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [hidden]
  Tensor lm_head;     // [vocab, hidden]; aliases embed_tokens when embeddings are tied
};

struct LoadOptions {
  // Element type of the projection matrices and embeddings in memory. kF32 or kBF16.
  // Tensors already stored in that type are memory-mapped (see map_weights), others are converted
  // once at load.
  // "auto" (unset): bf16 for bf16/f16 checkpoints, f32 for f32 checkpoints.
  bool weight_dtype_auto = true;
  DType weight_dtype = DType::kF32;
  bool show_progress = false;  // log one line per loaded shard / converted tensor group
  // Threads used for dtype conversions; 0: DefaultComputeThreads().
  int num_threads = 0;
  // Weight-only quantization of the projections and lm_head (embeddings and norms stay dense),
  // made at load time from the checkpoint's values (common/base/quant.h). Must stay kNone for
  // checkpoints that are already quantized (AWQ / GPTQ), which load as int4 by themselves; fp8
  // checkpoints load as fp8 by themselves and also take kFp8 (their dense projections are then
  // quantized too). kFp8 is always in WeightLayout::kRows (quant_layout does not apply).
  WeightQuant quantization = WeightQuant::kNone;
  int64_t quant_group_size = 128;  // int4: a power of two >= 32
  // Layout of quantized tensors (made at load or converted from AWQ / GPTQ; common/base/quant.h):
  // kTiles16 is what CPU backends with int8 MatMul inputs take (and all they take), kRows every
  // other path.
  WeightLayout quant_layout = WeightLayout::kRows;
  // Layout of dense bf16 projections and lm_head (embeddings stay rows; a tied lm_head gets a
  // copy): kTiles16 is what CPU backends with bf16 MatMul inputs on AVX512_BF16 take, kRows any
  // other path. Ignored for f32 weights.
  WeightLayout bf16_layout = WeightLayout::kRows;
  // true: tensors stored in their in-memory dtype are used straight from the checkpoint's file
  // mapping (no copy; page-cache memory in 4 KiB pages). false: they are copied at load into the
  // model's huge-page memory like converted tensors (CPU decode streams every weight each step,
  // and huge pages spare it TLB misses), at the cost of a copy.
  bool map_weights = true;
};

// A loaded model: config, weights and whatever keeps the weights' bytes alive.
class Model {
 public:
  ~Model();
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  DType weight_dtype() const { return weight_dtype_; }
  // kInt4 for AWQ / GPTQ checkpoints as well as for LoadOptions::quantization int4; kFp8 for fp8
  // checkpoints (compressed-tensors, fbgemm_fp8, fp8) and LoadOptions::quantization fp8.
  WeightQuant quantization() const { return quantization_; }
  // Layout of the quantized tensors (LoadOptions::quant_layout; meaningless without them).
  WeightLayout quant_layout() const { return quant_layout_; }
  // Layout of the dense bf16 projections and lm_head (LoadOptions::bf16_layout; kRows for f32
  // weights).
  WeightLayout bf16_layout() const { return bf16_layout_; }
  // The checkpoint's own quantization (AWQ / GPTQ / fp8), method kNone for dense checkpoints.
  const CheckpointQuantConfig& checkpoint_quant() const { return checkpoint_quant_; }
  // Bytes of weights one decode step reads (every projection and lm_head as stored, plus one
  // embedding row): the numerator of the memory roofline.
  size_t decode_weight_bytes() const;
  const std::string& dir() const { return dir_; }
  // A stable identifier for handshakes: architecture, shapes and a digest of the weights' header.
  const std::string& model_id() const { return model_id_; }
  // Bytes of weights held in owned (converted or realigned) buffers rather than mapped from the
  // checkpoint; 0 when every tensor is served straight from the files.
  size_t owned_bytes() const { return owned_bytes_; }

 private:
  friend class ModelLoader;
  Model() = default;
  ModelConfig config_;
  ModelWeights weights_;
  DType weight_dtype_ = DType::kF32;
  WeightQuant quantization_ = WeightQuant::kNone;
  WeightLayout quant_layout_ = WeightLayout::kRows;
  WeightLayout bf16_layout_ = WeightLayout::kRows;
  CheckpointQuantConfig checkpoint_quant_;
  std::string dir_;
  std::string model_id_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  // Converted, realigned and quantized tensors (huge pages: decode streams them every step).
  HugePageArena arena_;
  std::vector<std::vector<int32_t>> owned_perms_;
  size_t owned_bytes_ = 0;
};

// Loads a Hugging Face model directory: config.json (+ generation_config.json) and either
// model.safetensors or model.safetensors.index.json with its shards. Every error names the file
// and, where relevant, the tensor (missing, wrong shape, unsupported dtype, out of file bounds).
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir,
                                                 const LoadOptions& options);

}  // namespace tandem
