#pragma once

// The CUDA backend: the same Backend interface as the CPU backend, running Llama-family forward
// passes on one GPU. This header needs no CUDA headers; see README.md for streams, graphs and
// memory ownership.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/backend/backend.h"
#include "common/engine/model/model.h"

namespace tandem {

// Whether products over fp8 weights of more than 8 rows (prefill, large batches) run on FP8 tensor
// cores (README.md, "Quantized weights"): activations quantized to e4m3 per token, one cuBLASLt
// FP8 GEMM with the weight's per-channel and the tokens' scales.
enum class Fp8GemmMode : uint8_t {
  kAuto,  // where it applies (fp8 weights, compute capability 8.9 or above, bf16_activations)
  kOff,   // the weight-only path (dequantized tiles + cuBLAS), whatever the device
  kOn,    // as kAuto, but refused at creation where it does not apply
};

struct CudaBackendOptions {
  int device = 0;                 // CUDA device index
  int64_t block_size = 16;        // tokens per KV block
  DType kv_dtype = DType::kBF16;  // kF32 or kBF16
  // KV pool size: num_blocks > 0 is taken as is; else kv_cache_bytes > 0 is the pool's budget
  // (refused when it does not fit under gpu_memory_utilization * total device memory with the
  // weights and buffers); else the pool takes what is left of that share once the weights and
  // buffers are allocated.
  int64_t num_blocks = 0;
  int64_t kv_cache_bytes = 0;
  double gpu_memory_utilization = 0.9;
  // Initial capacity of the per-step buffers (grown on demand; growing re-captures the graphs).
  int64_t max_num_tokens = 2048;
  int64_t max_num_seqs = 256;
  int64_t max_model_len = 0;  // 0: the model's max_position_embeddings (capped at 131072)
  // Every step of at most max_graph_tokens tokens without a per-layer hook (decode, speculative
  // verification, mixed prefill + decode) replays two CUDA graphs, the layers for its token-count
  // bucket and the logit rows for its row-count bucket, all captured when the backend is
  // created; larger steps run eagerly.
  bool cuda_graphs = true;
  int64_t max_graph_tokens = 512;
  // bf16 weights: the matmul inputs (norm, attention and SiLU outputs) are produced in bf16,
  // rounded to nearest even as the CPU's bf16-input path rounds them, and multiplied on tensor
  // cores (one product per projection). false is the parity mode: f32 activations (split into
  // bf16 hi + lo for the tensor cores above kGemvMaxRows rows), within ~1e-5 of f32 inputs, what
  // the CPU computes with --matmul-input-dtype f32.
  bool bf16_activations = true;
  // fp8 weights: the FP8 tensor-core GEMM above 8 rows (kAuto) or the weight-only path (kOff,
  // which the f32 parity mode, bf16_activations = false, always takes).
  Fp8GemmMode fp8_gemm = Fp8GemmMode::kAuto;
  // Page-locked staging for the asynchronous whole-block copies of the KV tiers whose host side is
  // not the host tier's pinned memory (Backend::StartBlockRead / StartBlockWrite; block_staging.h),
  // allocated on the first such copy: staged copies in flight at once = this / the bytes of one
  // block (at least one).
  int64_t block_staging_bytes = int64_t{64} << 20;
  // LoRA (--max-loras, --max-lora-rank, --lora-dtype resolved): device memory for lora_slots
  // adapters of rank up to lora_max_rank on every target, kept in lora_dtype, reserved before
  // the KV pool is sized, so that adapters never compete with the KV cache for memory
  // (device_lora.h). 0: no LoRA path (a step with an adapter is refused).
  int64_t lora_slots = 0;
  int64_t lora_max_rank = 16;
  DType lora_dtype = DType::kBF16;
};

// True when the CUDA runtime sees at least one device. Otherwise false with the reason in `why`
// (no driver, no device, CUDA_VISIBLE_DEVICES hides them, ...), fit for an error message.
bool CudaDeviceAvailable(std::string* why);

// "NVIDIA H200 (sm_90, 132 SMs, 140 GiB)" or the reason it cannot be described.
std::string CudaDeviceDescription(int device);

// Uploads the weights to `options.device` and allocates the KV pool there.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(std::shared_ptr<const Model> model,
                                                           const CudaBackendOptions& options);

// Device address of a CUDA backend's (layer, block) KV region (Backend::HostBlockRegion is
// nullptr there), for transports that move device memory (NCCL); nullptr when `backend` is not
// a CUDA backend or the region is out of range. Pure address arithmetic, safe from any thread.
// The bytes are current when Forward has returned; inside the on_layer_done hook, for the hook's
// layer, once CudaKvLayerReadyEvent(layer) completed (the backend does not synchronize its
// stream per layer: a consumer waits on the device, cudaStreamWaitEvent).
uint8_t* CudaDeviceBlockRegion(Backend* backend, int64_t layer, int32_t block);

// The cudaEvent_t a CUDA backend records on its stream right after it enqueued layer `layer`'s
// KV writes of a step with an on_layer_done hook (before calling the hook); nullptr when
// `backend` is not a CUDA backend or the layer is out of range. Lives as long as the backend;
// each such step records it again. Safe from any thread.
void* CudaKvLayerReadyEvent(Backend* backend, int64_t layer);

}  // namespace tandem
