#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/config/model_config.h"
#include "common/engine/model/tensor.h"

namespace tandem {

// Writers for Hugging Face model directories: safetensors files (single or sharded) and
// random-initialised Llama-family models at real shapes, for tests and benchmarks.

struct NamedTensor {
  std::string name;
  Tensor tensor;  // dtype kF32, kBF16 or kF16; `data` holds tensor.nbytes() bytes
};

// Writes one safetensors file: 8-byte little-endian header length, the JSON header (tensors in
// the given order, data_offsets contiguous, "__metadata__" = `metadata`) padded with spaces so the
// data region starts at a 64-byte file offset (a multiple of 8, as the format asks), then the data.
// The file appears atomically (written to `path`.tmp, then renamed).
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {
                                  {"format", "pt"}});

// Streams a safetensors file whose tensor list is known up front: Append the tensors' bytes in
// order (in any number of pieces), then Finish. Destroying an unfinished writer removes the
// partial file.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    size_t nbytes() const;
  };

  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, const std::vector<Spec>& specs,
      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  absl::Status Append(const void* data, size_t bytes);
  // Checks that exactly the announced bytes were appended, closes and renames into place.
  absl::Status Finish();

 private:
  SafetensorsWriter(std::string path, int fd, uint64_t data_bytes)
      : path_(std::move(path)), fd_(fd), data_bytes_(data_bytes) {}
  std::string path_;
  int fd_;
  uint64_t data_bytes_;
  uint64_t written_ = 0;
};

// The safetensors header (JSON text, unpadded) for `specs` laid out contiguously in order.
std::string SafetensorsHeaderJson(const std::vector<SafetensorsWriter::Spec>& specs,
                                  const std::map<std::string, std::string>& metadata);

// Hugging Face tensor names and shapes of a model with `config`, in the order the writer stores
// them: embed_tokens, then per layer input_layernorm, q/k/v (+ biases), o,
// post_attention_layernorm, gate/up/down, then model.norm and (untied only) lm_head.
std::vector<SafetensorsWriter::Spec> ModelTensorSpecs(const ModelConfig& config, DType dtype);

struct RandomModelOptions {
  // "llama-1b": Llama-3.2-1B's transformer (hidden 2048, ffn 8192, 16 layers, 32 heads, 8 KV
  //             heads, head_dim 64, rope_theta 500000 with llama3 scaling factor 32, max position
  //             131072) with an untied lm_head and the Llama 2 vocabulary (32000); ~1.1B params.
  // "llama-110m": stories110M's shape (hidden 768, ffn 2048, 12 layers, 12 heads, MHA), vocab
  //             32000, max position 2048, tied embeddings like llama2.c's export.
  // "tiny":     hidden 64, ffn 176, 2 layers, 4 heads, 2 KV heads (head_dim 16), vocab 32000,
  //             max position 2048, tied; ~2.1M params, for fast tests.
  // "qwen3-0.6b": Qwen3-0.6B (hidden 1024, ffn 3072, 28 layers, 16 heads, 8 KV heads, head_dim
  //             128, per-head q/k norms, rope_theta 1e6, vocab 151936, tied).
  // "qwen3-tiny": Qwen3 at hidden 64, ffn 176, 2 layers, 4 heads, 2 KV heads, head_dim 32, with
  //             the Qwen3 vocabulary (151936) and tokenizer; for tests.
  // "phi3-mini": Phi-3-mini-4k-instruct (hidden 3072, ffn 8192, 32 layers, 32 heads, MHA,
  //             head_dim 96, sliding window 2047, vocab 32064, untied; fused qkv and gate/up).
  // "phi3-tiny": Phi-3 at hidden 64, ffn 176, 2 layers, 4 heads, 2 KV heads, LongRoPE (long
  //             factors from position 32 on), a 48-token sliding window; for tests.
  // "gemma3-1b": Gemma-3-1B's text model (hidden 1152, ffn 6912, 26 layers, 4 heads, 1 KV head,
  //             head_dim 256, a 512-token window on five layers of six, vocab 262144, tied).
  // "gemma3-tiny": Gemma 3 at hidden 64, 3 layers (the middle one global), a 24-token window,
  //             query_pre_attn_scalar 24 and final logit soft-capping 30; for tests.
  // "gemma2-2b": Gemma-2-2B (hidden 2304, ffn 9216, 26 layers, 8 heads, 4 KV heads, head_dim
  //             256, a 4096-token window on every other layer, attention soft-capping 50, final
  //             30, vocab 256000, tied).
  // "gemma2-tiny": Gemma 2 at hidden 64, 4 layers (local, global, local, global), a 24-token
  //             window, query_pre_attn_scalar 24, attention soft-capping 2 (so that it bites
  //             at this scale) and final 30; for tests.
  // "phi4-mini": Phi-4-mini-instruct (hidden 3072, ffn 8192, 32 layers, 24 heads, 8 KV heads,
  //             head_dim 128 of which 96 rotate, LongRoPE from 4096, vocab 200064, tied).
  // "phi4-tiny": Phi-4-mini's shape at hidden 64, 2 layers, head_dim 32 of which 24 rotate,
  //             LongRoPE from position 32 on, tied; for tests.
  // "qwen1.5-moe-a2.7b", "qwen2-57b-a14b": Qwen2-MoE blocks (60 experts of ffn 1408, top 4,
  //             shared ffn 5632; 64 of ffn 2560, top 8, shared ffn 20480); "qwen2moe-tiny": 8
  //             experts of ffn 32, top 2, shared ffn 96 at hidden 64; Qwen tokenizer.
  // The Gemma and Phi-4 presets carry the Llama 2 tokenizer (theirs are not bundled).
  std::string preset = "tiny";
  // Replaces the preset's config entirely when set (any supported architecture, e.g. Qwen2).
  std::optional<ModelConfig> config;
  // Field overrides applied on top of the preset (or `config`); 0 keeps the value.
  int64_t vocab_size = 0;
  int64_t num_layers = 0;
  int64_t max_position_embeddings = 0;

  DType dtype = DType::kBF16;  // kBF16 or kF32: every tensor is stored in it
  uint64_t seed = 0;
  // Projections, embeddings and biases: uniform with this standard deviation (transformers'
  // initializer_range); norm weights are 1.
  double init_std = 0.02;
  // Norm weights: 1 plus uniform noise of this standard deviation (0: exactly 1). References
  // catch a norm whose weight is dropped only when it is not 1.
  double norm_std = 0.0;
  // Copies tokenizer.json (required), tokenizer_config.json, special_tokens_map.json and
  // tokenizer.model (when present) from this directory; empty: no tokenizer files.
  std::string tokenizer_dir;
  // > 0: split the weights into model-0000i-of-0000n.safetensors files of at most this many
  // bytes each (a larger tensor gets a file of its own) plus model.safetensors.index.json.
  int64_t max_shard_bytes = 0;
  int num_threads = 0;  // generator threads; 0: DefaultComputeThreads()
  bool show_progress = false;
};

// The preset names, comma-separated, for help texts and errors.
std::string RandomModelPresetNames();

// The config of a preset (RandomModelPresetNames()); InvalidArgument for other names.
absl::StatusOr<ModelConfig> RandomModelPresetConfig(const std::string& preset);

// Writes config.json, generation_config.json, the weights and the tokenizer files to `out_dir`
// (created if needed). Deterministic: the same options produce byte-identical files, whatever the
// thread count (each value is a function of seed, tensor name and index only).
absl::Status WriteRandomModel(const RandomModelOptions& options, const std::string& out_dir);

}  // namespace tandem
