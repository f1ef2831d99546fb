#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/engine/lora/lora_registry.h"

namespace tandem {

// The CPU KV pool's budget when EngineBuildOptions::kv_cache_bytes is 0.
inline constexpr int64_t kDefaultCpuKvCacheBytes = int64_t{1} << 30;

// Everything needed to stand up an engine on a model directory.
struct EngineBuildOptions {
  std::string model_dir;
  // "cpu", "cuda" (device 0), "cuda:N", or "auto": cuda when this build has the CUDA backend
  // and a GPU is visible, else cpu.
  std::string device = "cpu";
  // cuda: the fraction of device memory the process may use: the KV pool gets what is left after
  // weights and buffers, or kv_cache_bytes when set, which must fit under it (num_kv_blocks > 0
  // overrides both).
  double gpu_memory_utilization = 0.9;
  std::string weight_dtype = "auto";  // auto | f32 | bf16
  // auto (f32 for f32 weights, else bf16) | f32 | bf16 | fp8 (e4m3) | int8; fp8 and int8 keep
  // one f32 scale per (token, kv head) row, cpu only.
  std::string kv_cache_dtype = "auto";
  std::string quantization = "none";  // none | int8 | int4 | fp8 (weight-only)
  int64_t quant_group_size = 128;     // int4 group along K (power of two >= 32)
  // What the projections' inputs are rounded to. cpu (CpuBackendOptions): auto (int8 for int8 and
  // int4 weights on a CPU with AVX512_VNNI, bf16 for bf16 weights (and quantized ones without
  // VNNI) on a CPU with AVX512_BF16, else f32) | f32 | bf16 (not with f32 weights) | int8
  // (quantized weights only). cuda (CudaBackendOptions::bf16_activations): auto and bf16 give
  // bf16 activations for bf16 weights, f32 the parity mode (f32 activations); int8 is refused.
  std::string matmul_input_dtype = "auto";
  // cpu: serve weights stored in their in-memory dtype from the checkpoint's file mapping
  // (LoadOptions::map_weights) instead of copying them into huge-page memory at load. cuda
  // always maps (the weights are uploaded to the device). bf16 projections with bf16 inputs on
  // AVX512_BF16 are rearranged into tiles at load either way (LoadOptions::bf16_layout).
  bool mmap_weights = false;
  // KV pool budget; 0: kDefaultCpuKvCacheBytes on cpu, on cuda what gpu_memory_utilization
  // leaves.
  int64_t kv_cache_bytes = 0;
  int64_t num_kv_blocks = 0;  // > 0 overrides kv_cache_bytes
  // cpu: local (sliding-window) layers of models that also have global ones keep only their
  // window's KV (KvCacheSpec::windowed); off: every layer keeps every block.
  bool window_kv = true;
  int64_t block_size = 16;
  int threads = 0;  // compute threads; 0: one per core
  bool show_progress = true;
  // LoRA adapters (vLLM's --enable-lora and friends): BuildEngine makes the registry
  // (engine.lora) with these modules loaded unless engine.lora is set already.
  LoraOptions lora;
  EngineOptions engine;
};

struct BuiltEngine {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Engine> engine;
};

// Resolves EngineBuildOptions::device to "cpu" or "cuda:N". Errors: an unknown name, or cuda
// asked for when the build has no CUDA backend or no GPU/driver is usable (the reason is named).
absl::StatusOr<std::string> ResolveDevice(const std::string& device);

// The structured-output compiler for a model directory's tokenizer (tokenizer.json).
absl::StatusOr<std::shared_ptr<grammar::GrammarCompiler>> LoadGrammarCompiler(
    const std::string& model_dir);

// Loads the model, creates the backend with a KV pool sized from the budget and the engine.
absl::StatusOr<BuiltEngine> BuildEngine(const EngineBuildOptions& options);

// Parses sizes such as "1073741824", "512MiB", "2GiB", "1.5G" (powers of 1024).
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);

}  // namespace tandem
